"""headscope on a CUDA GPU: scores against the CPU, scan/bare with synchronised timing, peak memory.

    bash benchmarks/device_check.sh                # on a machine with a CUDA GPU; under 5 minutes
    python benchmarks/device_check.py --device cpu --lengths 256 --long 512   # a dry run anywhere

Writes ``OUT/device_check.json`` and ``OUT/device_check.md`` (OUT: ``--out``, default
``build/device-check``). Three parts:

1. **Scores.** For each bundled model (SmolLM2-135M, Gemma 3 270M, MiniLM), the token-level scan
   (previous-token, duplicate-token, induction, sink on repeated random tokens, 8 × 256 tokens) and,
   for the causal models, retrieval (2 needles at 1,000 tokens, query-selective capture), first on
   the CPU in float32 (the reference), then on the device in float32 and in bfloat16. Reported: the
   largest |score − CPU score| per table, and how many of the CPU's top-10 heads the device run also
   has in its top 10. Tolerances: float32 within 1e-4 and 10/10; bfloat16 within 0.05 and ≥ 7/10
   (the weights are computed in float32 from bfloat16 queries and keys, whose 8-bit mantissa moves
   scores by a few 1e-3 and can swap heads that are within that of each other); retrieval in
   bfloat16 within 0.1, since it is a share of about a dozen answer tokens and one argmax may flip.
2. **Speed.** scan/bare at each ``--lengths`` (SmolLM2, whose limit is 8,192) and ``--long``
   (Gemma 3), one sequence of L tokens: the token-level scan against a bare forward (the base
   model with SDPA attention, no weights), each the best of 3 after a warm-up, timed between
   ``torch.cuda.synchronize()`` calls; and retrieval's selective capture against the same bare
   forward. 3. **Memory.** ``torch.cuda.max_memory_allocated`` above the loaded model, per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import headscope as hs
from headscope import analyses, capture, detectors
from headscope.models import load

MODELS = ("smollm2-135m", "gemma3-270m", "minilm-l6")
TOKEN_DETECTORS = ["previous-token", "duplicate-token", "induction", "sink"]
TOLERANCE = {"float32": (1e-4, 10), "bfloat16": (0.05, 7)}
# Retrieval is a share of about a dozen answer tokens: in bfloat16 one argmax may flip (1/12).
RETRIEVAL_BF16 = 0.1


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_mb(device: str, base: float) -> float | None:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20 - base
    return None


def allocated_mb(device: str) -> float:
    return torch.cuda.memory_allocated() / 2**20 if device.startswith("cuda") else 0.0


def scores(model: str, device: str, dtype: str) -> dict[str, torch.Tensor]:
    loaded = load(model, device=device, dtype=dtype)
    m, t = loaded.model, loaded.tokenizer
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
        found = {}
        result = hs.scan(
            m, t, detectors=",".join(TOKEN_DETECTORS), weights=False, seq_len=128, n_seqs=8, resamples=0
        )
        for name in TOKEN_DETECTORS:
            with contextlib.suppress(Exception):
                found[name] = torch.as_tensor(result.scores(name), dtype=torch.float64)
        if loaded.is_causal:
            retrieval = hs.retrieval(m, t, context="1000", depths="0.5", needles=2, resamples=0)
            found["retrieval"] = torch.as_tensor(retrieval.scores("retrieval"), dtype=torch.float64)
    del loaded, m
    return found


def compare(reference: dict, got: dict, dtype: str) -> list[dict]:
    rows = []
    for name, ref in reference.items():
        tolerance, overlap_min = TOLERANCE[dtype]
        if name == "retrieval" and dtype == "bfloat16":
            tolerance = RETRIEVAL_BF16
        if name not in got:
            rows.append({"table": name, "ok": False, "why": "missing on the device"})
            continue
        diff = float((got[name] - ref).abs().max())
        k = min(10, ref.numel())
        top_ref = set(ref.flatten().topk(k).indices.tolist())
        top_got = set(got[name].flatten().topk(k).indices.tolist())
        overlap = len(top_ref & top_got)
        rows.append(
            {
                "table": name,
                "max_abs_diff": diff,
                "top10_overlap": overlap,
                "ok": diff <= tolerance and overlap >= min(overlap_min, k),
            }
        )
    return rows


def best_of(device: str, run, repeats: int = 3) -> float:
    run()
    sync(device)
    times = []
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - started)
    return min(times)


def speed(model: str, device: str, dtype: str, lengths: list[int]) -> list[dict]:
    loaded = load(model, device=device, dtype=dtype)
    base = allocated_mb(device)
    out = []
    for length in lengths:
        spec = analyses.RepeatSpec(seq_len=length // 2, repeats=2, n_seqs=1, seed=0, bos=False)
        sequences, specials, _ = analyses.repeated_tokens(loaded, spec)
        batches = capture.make_batches(
            [s[:length] for s in sequences],
            [s[:length] for s in specials],
            batch_size=1,
            pad_id=0,
            is_causal=True,
        )
        on_device = [b.to(device) for b in batches]

        def bare(on_device=on_device) -> None:
            loaded.model.set_attn_implementation("sdpa")
            try:
                with torch.inference_mode():
                    for b in on_device:
                        loaded.base(
                            input_ids=b.input_ids, attention_mask=b.attention_mask.long(), use_cache=False
                        )
            finally:
                loaded.model.set_attn_implementation(capture.STREAM_IMPLEMENTATION)

        def scan(batches=batches) -> None:
            chosen = detectors.create(TOKEN_DETECTORS)
            analyses.score_batches(loaded, batches, chosen, 1, "device-check")
            for detector in chosen:
                detector.results()

        row = {"model": model, "dtype": dtype, "length": length}
        for name, run in (("bare", bare), ("scan", scan)):
            reset_peak(device)
            row[f"{name}_s"] = best_of(device, run)
            row[f"{name}_peak_mb"] = peak_mb(device, base)
        row["scan_over_bare"] = row["scan_s"] / row["bare_s"]
        print(
            f"  {model} {dtype} {length}: scan/bare {row['scan_over_bare']:.2f} "
            f"(bare {row['bare_s']:.3f} s, peak +{row['bare_peak_mb'] or 0:.0f} MB; "
            f"scan peak +{row['scan_peak_mb'] or 0:.0f} MB)",
            file=sys.stderr,
        )
        out.append(row)
    return out


def markdown(data: dict) -> str:
    lines = [
        f"# headscope device check: {data['device_name']}",
        "",
        "## Scores against the CPU (float32)",
        "",
    ]
    lines += ["| model | dtype | table | max abs diff | top-10 overlap | ok |", "|---|---|---|---|---|---|"]
    for entry in data["scores"]:
        for row in entry["tables"]:
            diff = row.get("max_abs_diff")
            lines.append(
                f"| {entry['model']} | {entry['dtype']} | {row['table']} | "
                f"{'—' if diff is None else f'{diff:.1e}'} | {row.get('top10_overlap', '—')} | "
                f"{'yes' if row['ok'] else '**no**'} |"
            )
    lines += ["", "## scan / bare (synchronised timing, best of 3)", ""]
    lines += [
        "| model | dtype | tokens | bare s | scan s | scan / bare | bare peak MB | scan peak MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["speed"]:
        lines.append(
            f"| {row['model']} | {row['dtype']} | {row['length']:,} | {row['bare_s']:.3f} | {row['scan_s']:.3f} | "
            f"{row['scan_over_bare']:.2f} | {row['bare_peak_mb'] or 0:.0f} | {row['scan_peak_mb'] or 0:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", default="2048,8192", help="scan/bare lengths on SmolLM2")
    parser.add_argument("--long", default="2048,8192,32768", help="scan/bare lengths on Gemma 3")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path, default=Path("build/device-check"))
    args = parser.parse_args()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("device_check: no CUDA device here (torch.cuda.is_available() is False)")
    started = time.perf_counter()
    data: dict = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "torch": torch.__version__,
        "headscope": hs.__version__,
        "scores": [],
        "speed": [],
    }
    for model in args.models.split(","):
        reference = scores(model, "cpu", "float32")
        for dtype in ("float32", "bfloat16"):
            got = scores(model, device, dtype)
            tables = compare(reference, got, dtype)
            data["scores"].append({"model": model, "dtype": dtype, "tables": tables})
            print(
                f"{model} {dtype}: "
                + ", ".join(
                    f"{t['table']} {t.get('max_abs_diff', float('nan')):.1e} {'ok' if t['ok'] else 'NO'}"
                    for t in tables
                ),
                file=sys.stderr,
            )
    for dtype in ("float32", "bfloat16"):
        data["speed"] += speed("smollm2-135m", device, dtype, [int(x) for x in args.lengths.split(",")])
        data["speed"] += speed("gemma3-270m", device, dtype, [int(x) for x in args.long.split(",")])
    data["seconds"] = time.perf_counter() - started
    data["ok"] = all(row["ok"] for entry in data["scores"] for row in entry["tables"])
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("device_check.json", json.dumps(data, indent=1)),
        ("device_check.md", markdown(data)),
    ):
        tmp = args.out / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.out / name)
    print(markdown(data))
    print(
        f"device_check: {data['seconds']:.0f} s, scores {'ok' if data['ok'] else 'NOT ok'}", file=sys.stderr
    )
    sys.exit(0 if data["ok"] else 1)


if __name__ == "__main__":
    main()
