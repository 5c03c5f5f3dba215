"""How much does a headscope scan cost over a bare forward pass of the same batches?

    python benchmarks/bench_scan.py --model smollm2-135m --lengths 128,512,2048 --json out.json

For each sequence length, on the same token batches (a random segment repeated to fill the
length, so that every detector has work to do), after a warm-up run of each:

  (a) bare: the model's base forward with SDPA attention, no attention output, no scoring;
  (b) scan: headscope's streaming capture with the four head-level detectors
      (previous-token, duplicate-token, induction, sink);
  (c) tl:   TransformerLens ``detect_head`` (its TransformerBridge wrapping the same loaded HF
            model) for previous-token, duplicate-token and induction on the same sequences, decoded
            to text because detect_head takes text; only when transformer_lens is installed (an
            optional extra, ``pip install transformer-lens``); otherwise reported as null.

Each (length, method) runs in a fresh process. Wall time is the best of ``--repeats`` runs after
a warm-up; peak memory is how far the run lifts the process's peak resident set above what the
loaded model and batches already took. Quote the ratios, not the absolute times: these machines
are noisy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

from headscope import analyses, capture, detectors
from headscope.models import load


def high_water_mb() -> float:
    """The process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_batches(loaded, length: int, n_seqs: int, seed: int) -> list[capture.Batch]:
    segment = max(2, length // 2)
    spec = analyses.RepeatSpec(seq_len=segment, repeats=2, n_seqs=n_seqs, seed=seed, bos=False)
    sequences, specials, _ = analyses.repeated_tokens(loaded, spec)
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
    analyses.score_batches(loaded, batches, chosen, n, "bench")
    for detector in chosen:
        detector.results()


def tl_pass(bridge, texts: list[str]) -> None:  # pragma: no cover - optional dependency
    """TransformerLens's detect_head takes text, so the same token rows go in decoded."""
    from transformer_lens.head_detector import detect_head

    with torch.inference_mode():
        for text in texts:
            for pattern in ("previous_token_head", "duplicate_token_head", "induction_head"):
                detect_head(bridge, text, pattern)


def worker(mode: str, model: str, length: int, tokens: int, repeats: int, seed: int) -> dict:
    """One measurement in a fresh process, so that the peak-RSS high-water mark is this run's."""
    loaded = load(model, capture="stream" if mode == "scan" else "eager")
    batches = make_batches(loaded, length, max(1, tokens // length), seed)
    if mode == "bare":
        loaded.model.set_attn_implementation("sdpa")
        run = partial(bare_pass, loaded.base, batches)
    elif mode == "scan":
        run = partial(scan_pass, loaded, batches)
    else:  # pragma: no cover - optional dependency
        from transformer_lens.model_bridge import TransformerBridge  # type: ignore[import-not-found]

        bridge = TransformerBridge.boot_transformers(
            model, hf_model=loaded.model, tokenizer=loaded.tokenizer, device="cpu"
        )
        texts = [loaded.tokenizer.decode(row) for b in batches for row in b.input_ids.tolist()]
        run = partial(tl_pass, bridge, texts)
        repeats = 1
    before = high_water_mb()
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return {
        "seconds": best,
        "peak_mb": high_water_mb() - before,
        "sequences": len(batches[0].example_index),
        "heads": loaded.layout.n_heads,
    }


def measure(mode: str, args: argparse.Namespace, length: int) -> dict | None:
    command = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        "--model",
        args.model,
        "--lengths",
        str(length),
        "--tokens",
        str(args.tokens),
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
    ]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        print(
            f"{mode} at {length} failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
        )
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--worker", choices=["bare", "scan", "tl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(
            json.dumps(
                worker(args.worker, args.model, int(args.lengths), args.tokens, args.repeats, args.seed)
            )
        )
        return
    has_tl = importlib.util.find_spec("transformer_lens") is not None
    if not has_tl:
        print(
            "TransformerLens comparison skipped: transformer_lens is not installed (pip install transformer-lens)"
        )

    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        bare = measure("bare", args, length)
        scan = measure("scan", args, length)
        tl = measure("tl", args, length) if has_tl else None
        if bare is None or scan is None:
            continue
        n_seqs = scan["sequences"]
        one_layer_mb = n_seqs * scan["heads"] * length * length * 4 / 2**20
        row = {
            "length": length,
            "sequences": n_seqs,
            "bare_s": round(bare["seconds"], 4),
            "scan_s": round(scan["seconds"], 4),
            "tl_s": None if tl is None else round(tl["seconds"], 4),
            "ratio_scan_bare": round(scan["seconds"] / bare["seconds"], 3),
            "ratio_tl_scan": None if tl is None else round(tl["seconds"] / scan["seconds"], 3),
            "bare_peak_mb": round(bare["peak_mb"], 1),
            "scan_peak_mb": round(scan["peak_mb"], 1),
            "tl_peak_mb": None if tl is None else round(tl["peak_mb"], 1),
            "one_layer_attention_mb": round(one_layer_mb, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json is not None:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(rows, indent=2) + "\n")
        tmp.replace(args.json)


if __name__ == "__main__":
    main()
