"""Every analysis' cost as a multiple of a bare forward over the tokens its passes ran, by length.

    python benchmarks/bench_ratios.py --model smollm2-135m --lengths 512,2048,8192 [--json out.json]

One process, the model loaded once. For each length L, each analysis runs twice, side by side:
with query-selective capture (the default: exact weights only for the rows its detectors read,
the rest through the fused SDPA kernel) and with every row exact (``capture.rows.full_maps``). Its
time is priced by the cost ledger (:mod:`headscope.capture.ledger`, what ``--profile`` prints): a
bare forward (the base model with SDPA attention, no weights) is timed on one batch per length
bucket in the same run, and scaled by the tokens the analysis' passes ran; where a pass read
next-token losses, the bare forward is the whole ``model(...).logits``: the LM head at every
position, timed in the same run, is added ("+ head"; "base only" is the ratio without it, which an
analysis that needs the losses cannot reach). "passes" counts its forward passes; "× bare" is its
wall time over that estimate. Peak memory is how far the run lifts
the process's peak resident set (reset before each run, Linux ``clear_refs``) above where it
started, next to the same for one bare forward of L tokens.

The analyses, at length L:
- scan (token-level): previous-token, duplicate-token, induction and sink on random tokens repeated
  to L (4,096 tokens a batch); its bare forward is timed directly on the same batches.
- induction: ``hs.induction`` at seq_len (L-1)/2 (two copies and BOS), copy loss included.
- retrieval: ``hs.retrieval`` at context L, depth 0.5, 2 needles.
- kv-plan: ``hs.kv_plan`` at context L, method retrieval, sparsity 0.5, 2 needles, 1 text chunk;
  only where 1,280 <= L <= 2,048 (its default window, sink 64 + recent 256, needs a context of
  4 x 320, and its shipped text is shorter than 8,192 tokens: it refuses there).
- icl (loss curve): ``hs.icl`` at context L (L - 1 where L and BOS exceed the model's context:
  8,191 on SmolLM2), no tasks (the ICL score over the shipped haystacks).
- describe: ``hs.describe`` with windows of min(L, 1024) tokens, 4 per split (so not above 2,048:
  the 2,048 row already reads 1,024-token windows), its default rows per
  window (a seeded sample of query rows in blocks of 16: exact weights for those, the rest fused),
  without the cards' reading of what each head writes (``writes=False``: weights only, no tokens).
- qk: ``hs.qk`` on one head two thirds of the way up (SmolLM2: L20H0), 2 windows per split of
  min(L, 2,048) tokens, the default 64 query rows a window: each query's scores split exactly into
  the components below the head (every earlier head, MLP and the embedding, on both sides). Its
  cost is the decomposition's, not capture's: ``benchmarks/bench_qk.py`` prices it by depth and for
  every head. Not at 8,192 (one head at 2,048 tokens already lifts the peak by about 4 GB).
- ioi (en), ioi (zh): ``hs.ioi`` with its S-inhibition path patching, on each shipped prompt set
  (their own length, once; the default resamples: the intervals pick the name movers it patches).

Quote the ratios, not the seconds: these machines differ 3-4× in speed.
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
from headscope.capture import ledger, rows
from headscope.data.prompts import builtin
from headscope.files import check_writable, write_atomic
from headscope.models import load


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def peak() -> dict:
    """The rise of the peak resident set over the block (Linux: VmHWM reset by clear_refs)."""
    found: dict = {}
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    start = _status_mb("VmRSS")
    yield found
    found["mb"] = _status_mb("VmHWM") - start


def repeated(loaded, length: int, tokens: int = 4096) -> list[capture.Batch]:
    n_seqs = max(1, tokens // length)
    spec = analyses.RepeatSpec(seq_len=max(2, length // 2), repeats=2, n_seqs=n_seqs, seed=0, bos=False)
    sequences, specials, _ = analyses.repeated_tokens(loaded, spec)
    return capture.make_batches(
        [s[:length] for s in sequences],
        [s[:length] for s in specials],
        batch_size=n_seqs,
        pad_id=0,
        is_causal=loaded.is_causal,
    )


def scan_tokens(loaded, length: int):
    batches = repeated(loaded, length)

    def run() -> None:
        chosen = detectors.create(["previous-token", "duplicate-token", "induction", "sink"])
        analyses.score_batches(loaded, batches, chosen, sum(len(b.example_index) for b in batches), "bench")

    return run


def bare_seconds(loaded, batches) -> float:
    model = loaded.model
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            started = time.perf_counter()
            for batch in batches:
                loaded.base(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), use_cache=False
                )
            return time.perf_counter() - started
    finally:
        model.set_attn_implementation(capture.STREAM_IMPLEMENTATION)


KV_PLAN_MIN = 4 * (64 + 256)


QK_MAX = 2048
KV_PLAN_MAX = 2048
DESCRIBE_MAX = 2048


def analyses_at(length: int, loaded) -> dict:
    late = min(500, length - 8)
    qk_head = f"L{(2 * loaded.layout.n_layers) // 3}H0"
    # icl's windows start with BOS: at the model's whole context (8,192 on SmolLM2) one token less.
    icl_context = min(length, (loaded.max_positions or length + 1) - 1)
    runs = {
        "induction": lambda m, t: hs.induction(
            m, t, seq_len=(length - 1) // 2, n_seqs=max(1, 4096 // length), resamples=0
        ),
        "retrieval": lambda m, t: hs.retrieval(
            m, t, context=str(length), depths="0.5", needles=2, resamples=0
        ),
        "kv-plan": lambda m, t: hs.kv_plan(
            m,
            t,
            context=str(length),
            depths="0.5",
            needles=2,
            sparsity="0.5",
            method="retrieval",
            text_chunks=1,
            draws=1,
            resamples=0,
        ),
        # Both passes (fit and evaluation) over 4 windows of shipped text each.
        "describe": lambda m, t: hs.describe(
            m, t, context=min(length, 1024), windows=4, resamples=0, writes=False
        ),
        "icl (loss curve)": lambda m, t: hs.icl(
            m, t, context=icl_context, early=min(50, late - 1), late=late, tasks="none", fv=False, resamples=0
        ),
        "qk (one head)": lambda m, t: hs.qk(
            m, t, heads=qk_head, context=min(length, QK_MAX), windows=2, resamples=0
        ),
    }
    if length > QK_MAX:
        del runs["qk (one head)"]
    if length > DESCRIBE_MAX:  # its windows stop at 1,024 tokens: the 2,048 row already reads them
        del runs["describe"]
    # Its default window (sink 64 + recent 256) needs 4 x 320 tokens; its shipped haystack text is
    # shorter than 8,192 (docs/analyses/kv-plan.md applies plans at 8,192 with --apply-context).
    if not KV_PLAN_MIN <= length <= KV_PLAN_MAX:
        del runs["kv-plan"]
    return runs


def priced(loaded, name: str, length: int, run, selective: bool) -> dict:
    quiet = open(os.devnull, "w")  # noqa: SIM115
    with (
        contextlib.nullcontext() if selective else rows.full_maps(),
        ledger.recording() as book,
        rows.counting() as counts,
        peak() as memory,
        contextlib.redirect_stdout(quiet),
    ):
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    (cost,) = book.costs(loaded, {"run": seconds})
    return {
        "analysis": name,
        "length": length,
        "path": "selective" if selective else "full maps",
        "seconds": seconds,
        "passes": cost.passes,
        "tokens": cost.tokens,
        "bare_seconds": cost.bare_seconds,
        "head_seconds": cost.head_seconds,
        "ratio": cost.ratio,
        "ratio_base": cost.ratio_base,
        "exact_rows": counts.total_exact,
        "fused_rows": counts.total_fused,
        "peak_mb": memory["mb"],
    }


def measure(model: str, lengths: list[int], only: set[str] | None, save=None) -> dict:
    loaded = load(model)
    m, t = loaded.model, loaded.tokenizer
    out = []
    # Warm-up: the conformance checks, and every analysis once at 512 tokens (first-call costs such
    # as imports and tokenizer caches would otherwise land on whichever path runs first).
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
        # kv-plan needs KV_PLAN_MIN tokens
        warm = {**analyses_at(KV_PLAN_MIN, loaded), **analyses_at(512, loaded)}
        for name, fn in warm.items():
            if not only or name in only:
                fn(m, t)
        scan_tokens(loaded, 512)()
        if not only or "ioi" in only:
            hs.ioi(m, t, patch=False, resamples=0)
    for length in lengths:
        with peak() as memory:
            bare_forward = bare_seconds(loaded, repeated(loaded, length, tokens=length))
        entry = {"length": length, "bare_peak_mb": memory["mb"], "bare_forward_s": bare_forward}
        print(f"L={length}: bare forward {bare_forward:.2f} s, +{memory['mb']:.0f} MB", file=sys.stderr)
        runs = {"scan (token-level)": None, **analyses_at(length, loaded)}
        for name, fn in runs.items():
            if only and name not in only:
                continue
            for selective in (True, False):
                if name == "scan (token-level)":
                    run = scan_tokens(loaded, length)
                    row = priced(loaded, name, length, run, selective)
                    direct = bare_seconds(loaded, repeated(loaded, length))
                    row["bare_seconds"], row["ratio"] = direct, row["seconds"] / direct
                else:
                    row = priced(loaded, name, length, lambda fn=fn: fn(m, t), selective)
                row.update(entry)
                out.append(row)
                if save is not None:  # after every run: a crash keeps what was measured
                    save({"model": model, "torch_threads": torch.get_num_threads(), "runs": out})
                base = f", {row['ratio_base']:.2f}× base only" if row.get("head_seconds") else ""
                print(
                    f"  {name:20s} {row['path']:9s} {row['seconds']:7.1f} s  {row['ratio']:.2f}× bare{base} "
                    f"({row['passes']} passes)  +{row['peak_mb']:.0f} MB",
                    file=sys.stderr,
                )
    if not only or "ioi" in only:
        for lang in ("en", "zh"):
            data = builtin(f"ioi/{lang}.yaml")
            for selective in (True, False):
                row = priced(loaded, f"ioi ({lang})", 0, lambda d=data: hs.ioi(m, t, data=d), selective)
                out.append(row)
                if save is not None:
                    save({"model": model, "torch_threads": torch.get_num_threads(), "runs": out})
                print(
                    f"  ioi ({lang}) {row['path']:9s} {row['seconds']:7.1f} s  {row['ratio']:.2f}× bare",
                    file=sys.stderr,
                )
    return {"model": model, "torch_threads": torch.get_num_threads(), "runs": out}


def _mb(value: float) -> str:
    """A peak's rise in MB; a rise that rounds to zero or below (the block freed more than it took)
    shows as 0, not -0."""
    return f"{max(0, round(value)):>8d}"


def table(data: dict) -> str:
    lines = [
        f"{data['model']}, {data['torch_threads']} torch threads; × bare = wall time over a bare "
        "SDPA forward of the same tokens, both measured in this run; + head: the analysis reads "
        "next-token losses, so its bare forward includes the LM head at every position (base only: without it)",
        "",
        f"{'analysis':<26} {'tokens':>6}  {'passes':>6}  {'selective':>10}  {'full maps':>10}  "
        f"{'base only':>10}  {'exact rows':>10}  {'sel. MB':>8}  {'full MB':>8}  {'bare MB':>8}",
    ]
    runs = data["runs"]
    keys = list(dict.fromkeys((r["analysis"], r["length"]) for r in runs))
    for name, length in keys:
        pair = {r["path"]: r for r in runs if r["analysis"] == name and r["length"] == length}
        sel, full = pair.get("selective"), pair.get("full maps")
        if sel is None:
            continue
        share = sel["exact_rows"] / max(1, sel["exact_rows"] + sel["fused_rows"])
        # A run cut short keeps what it measured: a missing full-map run shows as "—".
        full_ratio = f"{full['ratio']:>9.2f}×" if full else f"{'—':>10}"
        full_mb = _mb(full["peak_mb"]) if full else f"{'—':>8}"
        # The selective run's ratio without the LM head, where its passes ran one.
        base = f"{sel['ratio_base']:>9.2f}×" if sel.get("head_seconds") else f"{'—':>10}"
        head = " + head" if sel.get("head_seconds") else ""
        lines.append(
            f"{name + head:<26} {length or '—':>6}  {sel['passes']:>6}  {sel['ratio']:>9.2f}×  {full_ratio}  "
            f"{base}  {share:>9.1%}  {_mb(sel['peak_mb'])}  {full_mb}  "
            + (_mb(sel["bare_peak_mb"]) if "bare_peak_mb" in sel else f"{'—':>8}")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="512,2048,8192")
    parser.add_argument("--only", default="", help="analyses to run, comma-separated (default: all)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--table", type=Path, help="print the table of an earlier --json and stop")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None

    if args.json:  # refused now, not after the measuring
        check_writable(args.json, "--json", force=True)

    def save(data: dict) -> None:
        if args.json:
            write_atomic(args.json, json.dumps(data, indent=1), "--json", force=True)

    data = measure(args.model, [int(x) for x in args.lengths.split(",")], only, save)
    save(data)
    print(table(data))


if __name__ == "__main__":
    main()
