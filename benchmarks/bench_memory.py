"""Peak memory of `headscope induction` (with its copy loss) against a bare SDPA forward.

    python benchmarks/bench_memory.py --model smollm2-135m --seq-len 1024 --batch 2
    python benchmarks/bench_memory.py --model gemma3-270m --seq-len 1024 --batch 2
    python benchmarks/bench_memory.py --model gemma3-270m --seq-len 4000 --batch 1 --skip-bare

Each measurement runs in a fresh process and reports that process's peak resident set, the
model load included (the GGUF's dequantized cache must exist: run any headscope command on the
model once first, or the cold dequantization's own peak is measured):

  (a) bare:      the base model's forward with SDPA attention over the same token rows
                 (BOS + a random segment repeated twice), no attention output, no LM head;
  (b) induction: ``analyses.induction`` as the CLI runs it: streaming capture, the induction and
                 duplicate-token detectors, the copy loss through the chunked LM head, bootstrap.

Quote the ratio, measured side by side in one run: these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(mode: str, model: str, seq_len: int, batch: int) -> dict:
    import torch

    from headscope import analyses
    from headscope.models import load

    loaded = load(model, capture="eager" if mode == "bare" else "stream")
    spec = analyses.RepeatSpec(seq_len=seq_len, repeats=2, n_seqs=batch, seed=0)
    after_load = peak_mb()
    start = time.perf_counter()
    if mode == "bare":
        loaded.model.set_attn_implementation("sdpa")
        sequences, specials, _ = analyses.repeated_tokens(loaded, spec)
        batches = analyses.model_batches(loaded, sequences, specials, batch)
        with torch.inference_mode():
            for b in batches:
                loaded.base(input_ids=b.input_ids, attention_mask=b.attention_mask.long(), use_cache=False)
        extra = {}
    else:
        report = analyses.induction(loaded, spec, batch_size=batch, n_resamples=1000)
        best = report.table[report.table.detector == "induction"].sort_values("score").iloc[-1]
        assert report.loss is not None
        extra = {
            "best_induction_head": f"L{best.layer}H{best['head']}",
            "best_induction_score": round(float(best.score), 3),
            "loss_first_copy": round(report.loss.first, 3),
            "loss_later_copies": round(report.loss.later, 3),
        }
    return {
        "mode": mode,
        "seconds": round(time.perf_counter() - start, 1),
        "tokens_per_row": len(analyses.repeated_tokens(loaded, spec)[0][0]),
        "peak_after_load_mb": round(after_load),
        "peak_mb": round(peak_mb()),
        **extra,
    }


def measure(mode: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        "--model",
        args.model,
        "--seq-len",
        str(args.seq_len),
        "--batch",
        str(args.batch),
    ]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--worker", choices=["bare", "induction"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.seq_len, args.batch)))
        return
    rows = [] if args.skip_bare else [measure("bare", args)]
    rows.append(measure("induction", args))
    for row in rows:
        print(json.dumps(row), flush=True)
    if not args.skip_bare:
        print(json.dumps({"ratio_peak_induction_bare": round(rows[1]["peak_mb"] / rows[0]["peak_mb"], 2)}))


if __name__ == "__main__":
    main()
