"""What the benchmark scripts share: best-of-N wall time, and a bare SDPA forward to compare with.

The scripts run as ``python benchmarks/bench_*.py``, so this folder is on ``sys.path``.
"""

from __future__ import annotations

import time

import torch


def best_of(repeats: int, run) -> float:  # noqa: ANN001
    """The shortest wall time of ``repeats`` calls of ``run()``, after one warm-up call."""
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def bare(loaded, batches, *, lm_head: bool = True) -> None:  # noqa: ANN001
    """The same model with SDPA attention (with its LM head, or the base model without), then back
    to headscope's streaming attention."""
    from headscope.capture import STREAM_IMPLEMENTATION

    module = loaded.model if lm_head else loaded.base
    loaded.model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            for batch in batches:
                module(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), use_cache=False)
    finally:
        loaded.model.set_attn_implementation(STREAM_IMPLEMENTATION)
