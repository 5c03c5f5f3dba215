"""qk's cost as a multiple of a bare forward over the same tokens: every head, and one head by depth.

    python benchmarks/bench_qk.py --model smollm2-135m --lengths 512,2048 [--json out.json] [--every 512]
    python benchmarks/bench_qk.py --model smollm2-135m --lengths 512 --graph 512 --every '' --no-depths \
        --json benchmarks/results/graph-smollm2-135m.json
    python benchmarks/bench_qk.py --table benchmarks/results/qk-smollm2-135m.json

One process, the model loaded once, priced by the cost ledger as ``bench_ratios.py`` prices every
analysis (a bare SDPA forward timed in the same run, scaled by the tokens qk's passes ran; a pass
that stops after layer l counts l/L of a forward). Two measurements per length L:

- every head (at the lengths of ``--every``): ``hs.qk`` over every head, 2 windows per split of L
  tokens of shipped English text, the default 64 query rows a window, no bootstrap;
- graph (at the lengths of ``--graph``): ``hs.graph`` over every head (qk's sides and the value
  side, the edges), the same windows; then the same with ``verify=3`` (three heads, each side's
  top source removed against 5 random sources: what the verify passes add);
- by depth (unless ``--no-depths``): one head (H0) of layers 0, L/6, ..., the last, at the same windows. Each source's share
  comes from one pull-back per head (no source is projected), so a head's decomposition costs a
  pass over the writes of the blocks below it (rebuilt from the heads' recorded outputs) against
  its pull-back, and its top sources through its own columns; every head shares each pass over
  the blocks' writes among the layers waiting for it.

Quote the ratios, not the seconds: these machines differ 3-4x in speed.
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
from headscope.capture import ledger
from headscope.files import write_atomic
from headscope.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ratios import peak  # noqa: E402


def priced(loaded, run) -> dict:
    with ledger.recording() as book, peak() as memory, contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    (cost,) = book.costs(loaded, {"run": seconds})
    return {
        "seconds": seconds,
        "passes": cost.passes,
        "tokens": cost.tokens,
        "bare_seconds": cost.bare_seconds,
        "ratio": cost.ratio,
        "peak_mb": memory["mb"],
    }


def measure(
    model: str,
    lengths: list[int],
    every_at: set[int],
    save=None,
    graph_at: set[int] = frozenset(),
    depths_too: bool = True,
) -> dict:
    loaded = load(model)
    layers = loaded.layout.n_layers
    depths = sorted({round(i * (layers - 1) / 5) for i in range(6)})
    hs.qk(loaded, heads="L1H0", context=128, windows=2, resamples=0)  # warm-up
    out = []
    for length in lengths:

        def every(length: int = length) -> None:
            hs.qk(loaded, context=length, windows=2, resamples=0)

        if length in every_at:
            row = {"what": "every head", "length": length, **priced(loaded, every)}
            out.append(row)
            print(f"L={length} every head: {row['seconds']:.0f} s, {row['ratio']:.1f}x bare", file=sys.stderr)
            if save is not None:
                save(
                    {"model": model, "layers": layers, "torch_threads": torch.get_num_threads(), "runs": out}
                )
        if length in graph_at:
            for label, verify in (("graph", 0), ("graph+verify 3", 3)):

                def whole(length: int = length, verify: int = verify) -> None:
                    hs.graph(loaded, context=length, windows=2, resamples=0, verify=verify)

                row = {"what": label, "length": length, **priced(loaded, whole)}
                out.append(row)
                print(
                    f"L={length} {label}: {row['seconds']:.0f} s, {row['ratio']:.1f}x bare", file=sys.stderr
                )
                if save is not None:
                    save(
                        {
                            "model": model,
                            "layers": layers,
                            "torch_threads": torch.get_num_threads(),
                            "runs": out,
                        }
                    )
        for depth in depths if depths_too else []:

            def one(depth: int = depth, length: int = length) -> None:
                hs.qk(loaded, heads=f"L{depth}H0", context=length, windows=2, resamples=0)

            row = {"what": f"L{depth}H0", "layer": depth, "length": length, **priced(loaded, one)}
            out.append(row)
            print(f"  L{depth}H0: {row['seconds']:.1f} s, {row['ratio']:.2f}x bare", file=sys.stderr)
            if save is not None:
                save(
                    {"model": model, "layers": layers, "torch_threads": torch.get_num_threads(), "runs": out}
                )
    return {"model": model, "layers": layers, "torch_threads": torch.get_num_threads(), "runs": out}


def table(data: dict) -> str:
    """x bare: over a bare forward of the layers the passes ran (a pass for a head of layer l stops
    after it); x full: over a bare forward of every layer, the same tokens (how cost grows with depth)."""
    # The depths always include the last layer, so a run saved without "layers" still tells it.
    layers = data.get("layers") or 1 + max(row.get("layer", 0) for row in data["runs"])
    lines = [
        f"{data['model']}, {data['torch_threads']} torch threads; x bare = wall time over a bare SDPA "
        "forward of the same tokens through the layers the passes ran, x full = through every layer; "
        "both measured in this run",
        "",
        f"{'heads':<14} {'tokens':>6}  {'passes':>6}  {'x bare':>8}  {'x full':>8}  {'peak MB':>8}",
    ]
    for row in data["runs"]:
        share = (row["layer"] + 1) / layers if "layer" in row else 1.0
        lines.append(
            f"{row['what']:<14} {row['length']:>6}  {row['passes']:>6}  {row['ratio']:>7.2f}x  "
            f"{row['ratio'] * share:>7.2f}x  {row['peak_mb']:>8.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--every", default="512", help="lengths at which every head is measured too")
    parser.add_argument("--graph", default="", help="lengths at which hs.graph over every head is measured")
    parser.add_argument("--no-depths", action="store_true", help="skip the one-head-by-depth rows")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--table", type=Path, default=None, help="print the table of a saved --json and stop")
    args = parser.parse_args()
    if args.table is not None:
        print(table(json.loads(args.table.read_text())))
        return

    def save(data: dict) -> None:
        if args.json is not None:
            write_atomic(args.json, json.dumps(data, indent=2) + "\n", "--json", force=True)

    every = {int(x) for x in args.every.split(",") if x}
    graph = {int(x) for x in args.graph.split(",") if x}
    data = measure(
        args.model, [int(x) for x in args.lengths.split(",")], every, save, graph, not args.no_depths
    )
    save(data)
    print(table(data))


if __name__ == "__main__":
    main()
