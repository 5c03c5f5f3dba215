"""Next-token losses from final hidden states: vocabulary slices against the earlier position chunks.

    python benchmarks/bench_lm_head.py --model gemma3-270m

One process, the model loaded once, random tokens. For each shape (batch × length) it times, side
by side, after one warm-up each: the base model's forward (SDPA, no LM head), the losses as
``capture.next_token_losses`` computes them (the head a vocabulary slice at a time over blocks of
positions, a running log-sum-exp), the earlier position chunks (``_losses_by_positions`` with its
former 2^24 logits a chunk: the whole head weight read once per few positions), and a plain
``hidden @ W.T`` over the whole vocabulary (what ``model(...).logits`` does). The largest error of
each way against float64 log-softmax is printed too. Quote the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import time

import torch

from headscope.capture import logits as head
from headscope.models import load


def timed(fn, repeats: int = 2) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def one_shape(loaded, ids: torch.Tensor) -> str:
    weight = loaded.model.get_output_embeddings().weight
    with torch.inference_mode():
        hidden = loaded.base(input_ids=ids, use_cache=False).last_hidden_state
        reference = -torch.log_softmax(hidden[:, :-1].double() @ weight.double().T, -1)
        reference = reference.gather(-1, ids[:, 1:, None])[..., 0]
        base = timed(lambda: loaded.base(input_ids=ids, use_cache=False), 1)
        sliced = timed(lambda: head.next_token_losses(loaded, hidden, ids))
        sliced_error = (head.next_token_losses(loaded, hidden, ids).double() - reference).abs().max()
        before = head._LOGIT_CHUNK_ELEMENTS
        head._LOGIT_CHUNK_ELEMENTS = 1 << 24  # the position chunks' former size
        try:
            chunks = timed(lambda: head._losses_by_positions(loaded, hidden, ids), 1)
            chunks_error = (head._losses_by_positions(loaded, hidden, ids).double() - reference).abs().max()
        finally:
            head._LOGIT_CHUNK_ELEMENTS = before
        plain = timed(lambda: hidden @ weight.T, 1)
    batch, length = ids.shape
    return (
        f"{batch}x{length}: base forward {base:.2f} s; losses in vocabulary slices {sliced:.2f} s "
        f"({sliced / base:.2f}x base, error {sliced_error:.1e}); position chunks {chunks:.2f} s "
        f"({chunks / base:.2f}x, error {chunks_error:.1e}); plain logits {plain:.2f} s ({plain / base:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--shapes", default="1x2048,16x256", help="batch x length, comma-separated")
    args = parser.parse_args()
    loaded = load(args.model)
    loaded.model.set_attn_implementation("sdpa")
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    print(f"{args.model}, {torch.get_num_threads()} torch threads, vocabulary {vocab:,}")
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.split("x"))
        print(one_shape(loaded, torch.randint(100, 20000, (batch, length), generator=generator)))


if __name__ == "__main__":
    main()
