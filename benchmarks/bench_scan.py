"""How much does a headscope scan cost over a bare forward pass of the same batches?

    python benchmarks/bench_scan.py --model smollm2-135m --lengths 128,512,2048 --json out.json

For each sequence length, on the same token batches (a random segment repeated to fill the
length, so that every detector has work to do), after a warm-up run of each:

  (a) bare: the model's base forward with SDPA attention, no attention output, no scoring;
  (b) scan: headscope's streaming capture with the four head-level detectors
      (previous-token, duplicate-token, induction, sink);
  (c) tl:   TransformerLens ``detect_head`` for the same three patterns on the same sequences,
            when transformer_lens is installed (an optional extra); otherwise reported as null.

Wall time is the best of ``--repeats`` runs; peak memory is the largest resident-set growth over
the run's starting point, sampled every 2 ms. Quote the ratios, not the absolute times: these
machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from functools import partial
from pathlib import Path

import torch

from headscope import analysis, capture, detectors
from headscope.models import load


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Largest RSS growth (MB) while the block runs, sampled in a thread."""

    def __enter__(self) -> PeakMemory:
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def mb(self) -> float:
        return (self.peak - self.start) / 2**20


def make_batches(loaded, length: int, n_seqs: int, seed: int) -> list[capture.Batch]:
    segment = max(2, length // 2)
    spec = analysis.RepeatSpec(seq_len=segment, repeats=2, n_seqs=n_seqs, seed=seed, bos=False)
    sequences, specials, _ = analysis.repeated_tokens(loaded, spec)
    sequences = [seq[:length] for seq in sequences]
    specials = [sp[:length] for sp in specials]
    return capture.make_batches(sequences, specials, batch_size=n_seqs, pad_id=0, is_causal=loaded.is_causal)


def bare_pass(model, batches) -> None:
    with torch.inference_mode():
        for batch in batches:
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), use_cache=False)


def scan_pass(loaded, batches) -> None:
    chosen = detectors.create(["previous-token", "duplicate-token", "induction", "sink"])
    n = sum(len(b.example_index) for b in batches)
    analysis.score_batches(loaded, batches, chosen, n, "bench")
    for detector in chosen:
        detector.results()


def tl_pass(bridge, batches) -> None:  # pragma: no cover - optional dependency
    from transformer_lens.head_detector import detect_head

    for batch in batches:
        for row in batch.input_ids:
            for pattern in ("previous_token_head", "duplicate_token_head", "induction_head"):
                detect_head(bridge, row[None], pattern)


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm-up
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        with PeakMemory() as memory:
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        peak = max(peak, memory.mb)
    return best, peak


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument(
        "--tokens", type=int, default=4096, help="tokens per batch (sequences = tokens // length)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    scanner = load(args.model)  # streaming capture
    bare = load(args.model, capture="eager")
    bare.model.set_attn_implementation("sdpa")
    try:
        from transformer_lens.model_bridge import TransformerBridge  # type: ignore[import-not-found]

        bridge = TransformerBridge.boot_transformers(bare.model)  # pragma: no cover
    except Exception as exc:  # noqa: BLE001 - any import or adapter failure means "skip (c)"
        bridge = None
        print(f"TransformerLens comparison skipped: {type(exc).__name__}: {exc}".splitlines()[0])

    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        batches = make_batches(scanner, length, max(1, args.tokens // length), args.seed)
        bare_s, bare_mb = timed(partial(bare_pass, bare.base, batches), args.repeats)
        scan_s, scan_mb = timed(partial(scan_pass, scanner, batches), args.repeats)
        tl_s = None
        if bridge is not None:  # pragma: no cover
            tl_s, _ = timed(partial(tl_pass, bridge, batches), 1)
        layout = scanner.layout
        one_layer_mb = len(batches[0].example_index) * layout.n_heads * length * length * 4 / 2**20
        row = {
            "length": length,
            "sequences": len(batches[0].example_index),
            "bare_s": round(bare_s, 4),
            "scan_s": round(scan_s, 4),
            "tl_s": None if tl_s is None else round(tl_s, 4),
            "ratio_scan_bare": round(scan_s / bare_s, 3),
            "ratio_tl_scan": None if tl_s is None else round(tl_s / scan_s, 3),
            "bare_peak_mb": round(bare_mb, 1),
            "scan_peak_mb": round(scan_mb, 1),
            "one_layer_attention_mb": round(one_layer_mb, 1),
        }
        rows.append(row)
        print(json.dumps(row))
    if args.json is not None:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(rows, indent=2) + "\n")
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
