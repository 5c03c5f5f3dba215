"""qk, scan and describe on a model of a larger shape: each one's cost as a multiple of a bare
forward, and its peak memory, by length; and, on paper, the largest context each fits in memory.

    python benchmarks/llama_shape.py --out build/llama-1b-shape
    python benchmarks/bench_shapes.py --model build/llama-1b-shape --lengths 512,2048 \\
        --only scan,describe,qk --qk-every-up-to 512 --qk-heads L15H0,L8H0 \\
        --json benchmarks/results/shapes-llama-1b.json
    python benchmarks/bench_shapes.py --table benchmarks/results/shapes-llama-1b.json
    python benchmarks/bench_shapes.py --paper [--budget-gb 24]

The model is meant to be the one ``benchmarks/llama_shape.py`` builds: Llama-3.2-1B's shape with
random weights. **Random weights are for cost and memory only, never for roles**: the table says
so, and nothing here reads a score. Time and memory depend on the shape and the tokens, which
are the real ones.

One process, the model loaded once, each analysis priced as ``bench_ratios.py`` prices it (its
helpers are imported, not copied): the cost ledger (:mod:`headscope.capture.ledger`) times a bare
SDPA forward in the same run and scales it by the tokens the analysis' passes ran; "x bare" is the
wall time over that estimate. "peak MB" is how far the run lifts the process's peak resident set
(Linux VmHWM, reset before each run); "bare MB" is the same for one bare forward of L tokens.
Each analysis runs once at 64 tokens first (first-call costs: imports, tokenizer caches). At
length L:

- qk: ``hs.qk`` over every head, 2 windows per split of L tokens of shipped English text, the
  default 64 query rows a window, no bootstrap. A refusal (qk refuses a window whose recording would
  not fit its memory bound) is recorded as the row, with the reason, and the run goes on.
- scan: ``bench_ratios.py``'s "scan (token-level)" row: previous-token, duplicate-token, induction
  and sink on random tokens repeated to L, 4,096 tokens a batch; its bare forward is timed directly
  on the same batches, as there.
- describe: ``bench_ratios.py``'s describe row: windows of min(L, 1,024) tokens, 4 per split,
  ``writes=False``; not above 2,048 tokens (as there: its windows stop at 1,024).

The analyses run in ``--only``'s order at each length (qk last by default: on paper it is the
one that can run out of memory), and the JSON is written after every row (atomically), so a run
that is cut off keeps what it measured. Quote the ratios, not the seconds: machines differ
several times in speed.

``--paper`` needs no model: from the shapes alone (the 1B shape as built, and Llama-3.1-8B) it
works out the largest context each analysis fits in ``--budget-gb``, float32 weights, and names
the term that dominates there. The terms each analysis is assumed to hold are in the docstrings
of :func:`scan_terms`, :func:`describe_terms` and :func:`qk_terms` (what the pull-back holds); the
constants they read (query chunk sizes, describe's block and cache, qk's budgets and refusal bound)
are imported from headscope, so they follow the code.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import headscope as hs
from headscope.analyses.describe import TEMPLATES, DescribeOptions
from headscope.analyses.describe.fit import _CACHE_BYTES, BLOCK
from headscope.analyses.qk import WAITING_BYTES
from headscope.capture.sources import BLOCK_BYTES, MAX_SOURCE_BYTES, PULLBACK_BYTES
from headscope.capture.stream import _CHUNK_ELEMENTS
from headscope.errors import HeadscopeError
from headscope.files import check_writable, write_atomic
from headscope.models import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ratios import analyses_at, bare_seconds, peak, priced, repeated, scan_tokens  # noqa: E402
from llama_shape import LLAMA_1B  # noqa: E402

ANALYSES = ("qk", "scan", "describe")
LABELS = {"qk": "qk (every head)", "scan": "scan (token-level)", "describe": "describe"}
WARM_LENGTH = 64
RANDOM_WEIGHTS = "random weights: for cost and memory only, never for roles"


def runs_at(
    loaded, length: int, warm: bool = False, heads: str | None = None
) -> dict[str, Callable[[], object] | None]:
    """What each analysis runs at ``length`` (None: not at this length). ``warm``: qk on one head
    of the first layer only, enough to pay its first-call costs; ``heads``: qk on these heads only
    (``--qk-heads``), every head without."""
    describe = analyses_at(length, loaded).get("describe")
    chosen = {"heads": "L0H0"} if warm else ({} if heads is None else {"heads": heads})
    return {
        "qk": lambda: hs.qk(loaded, context=length, windows=2, resamples=0, **chosen),
        "scan": scan_tokens(loaded, length),
        "describe": None if describe is None else lambda: describe(loaded.model, loaded.tokenizer),
    }


def shape_of(loaded) -> dict:
    layout, config = loaded.layout, loaded.model.config
    return {
        "layers": layout.n_layers,
        "heads": layout.n_heads,
        "kv_heads": layout.n_kv_heads,
        "head_dim": layout.head_dim,
        "d_model": layout.d_model,
        "mlp": getattr(config, "intermediate_size", None),
        "vocab": loaded.model.get_input_embeddings().num_embeddings,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
    }


def measure(
    model: str,
    lengths: list[int],
    only: list[str],
    machine: str,
    save,
    every_up_to: int | None = None,
    qk_heads: list[str] = (),
) -> dict:
    """``every_up_to``: qk on every head up to this length; above it, one row per head of ``qk_heads``
    (every head of a 1B shape at 2,048 tokens is hours on a 2-core CPU)."""
    loaded = load(model)
    data = {
        "model": model,
        "shape": shape_of(loaded),
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "torch_threads": torch.get_num_threads(),
        "note": RANDOM_WEIGHTS,
        "runs": [],
    }
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
        for name, run in runs_at(loaded, WARM_LENGTH, warm=True).items():
            if name in only and run is not None:
                with contextlib.suppress(HeadscopeError):  # a refusal is recorded by its row below
                    run()
    for length in lengths:
        with peak() as memory:
            bare_forward = bare_seconds(loaded, repeated(loaded, length, tokens=length))
        entry = {"bare_peak_mb": memory["mb"], "bare_forward_s": bare_forward}
        print(f"L={length}: bare forward {bare_forward:.2f} s, +{memory['mb']:.0f} MB", file=sys.stderr)
        planned = []
        for name in only:  # in the order asked: put the one likeliest to run out of memory last
            if name == "qk" and every_up_to is not None and length > every_up_to:
                planned += [(name, head, runs_at(loaded, length, heads=head)[name]) for head in qk_heads]
            else:
                planned.append((name, None, runs_at(loaded, length)[name]))
        for name, head, run in planned:
            if run is None:
                row = {
                    "analysis": name,
                    "length": length,
                    "skipped": "not at this length (as bench_ratios.py)",
                }
            else:
                try:
                    row = priced(loaded, name, length, run, selective=True)
                except HeadscopeError as error:  # its message carries the hint
                    row = {"analysis": name, "length": length, "refused": str(error)}
                else:
                    if name == "scan":  # as bench_ratios.measure: its own batches, timed directly
                        row["bare_seconds"] = bare_seconds(loaded, repeated(loaded, length))
                        row["ratio"] = row["seconds"] / row["bare_seconds"]
            row.update(entry)
            if head is not None:
                row["heads"] = head
            data["runs"].append(row)
            save(data)  # after every row: a run cut off keeps what it measured
            print("  " + _row(row), file=sys.stderr)
    return data


def _row(row: dict) -> str:
    name = LABELS[row["analysis"]] if "heads" not in row else f"{row['analysis']} ({row['heads']})"
    label = f"{name:<20} {row['length']:>6}"
    why = row.get("refused") or row.get("skipped")
    if why:
        return f"{label}  {why}"
    return (
        f"{label}  {row['passes']:>6}  {row['ratio']:>8.2f}x  {max(0, round(row['peak_mb'])):>8d}  "
        f"{max(0, round(row['bare_peak_mb'])):>8d}"
    )


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f}B" if parameters >= 1e9 else f"{parameters / 1e6:.1f}M"


def table(data: dict) -> str:
    shape = data["shape"]
    lines = [
        f"{data['model']}: {shape['layers']} layers, {shape['heads']} query heads over {shape['kv_heads']} KV "
        f"heads of {shape['head_dim']}, d_model {shape['d_model']}, MLP {shape['mlp']}, vocab {shape['vocab']}, "
        f"{_count(shape['parameters'])} parameters, {shape['dtype']}; {RANDOM_WEIGHTS}",
        f"{data['date']}, {data['machine']}, {data['torch_threads']} torch threads; x bare = wall time over a "
        "bare SDPA forward of the same tokens (the cost ledger; scan: its batches timed directly), both "
        "measured in this run; peak MB = how far the run lifts the process's peak resident set, bare MB = "
        "the same for one bare forward of the length's tokens",
        "",
        f"{'analysis':<20} {'tokens':>6}  {'passes':>6}  {'x bare':>9}  {'peak MB':>8}  {'bare MB':>8}",
    ]
    lines += [_row(row) for row in data["runs"]]
    return "\n".join(lines)


# --- on paper ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    tied: bool

    @property
    def parameters(self) -> int:
        d, attention = self.d_model, (2 * self.heads + 2 * self.kv_heads) * self.head_dim * self.d_model
        block = attention + 3 * d * self.mlp + 2 * d
        return self.vocab * d * (1 if self.tied else 2) + self.layers * block + d


SHAPES = (
    # As llama_shape.py builds it: SmolLM2's vocabulary (len(tokenizer)), tied embeddings.
    Shape(
        "Llama-3.2-1B shape",
        LLAMA_1B["layers"],
        LLAMA_1B["d_model"],
        LLAMA_1B["heads"],
        LLAMA_1B["kv_heads"],
        LLAMA_1B["d_model"] // LLAMA_1B["heads"],
        LLAMA_1B["mlp"],
        49152,
        True,
    ),
    Shape("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, False),
)
F32, F64 = 4, 8
PROCESS = 10**9  # Python, torch, headscope, the tokenizer and texts: 0.4 GB measured after a small load
SCORE_COPIES = 4  # one query chunk's scores, its softmax weights and two temporaries of its readers
QK_CHUNK = 512 << 20  # the heads whose pull-back is held at once fit this (at least one head)
SCAN_TOKENS = inspect.signature(repeated).parameters["tokens"].default  # tokens per scan batch
DESCRIBE_BATCH = DescribeOptions().batch_size  # windows per forward pass
DESCRIBE_WINDOWS = 4  # per split, as bench_ratios.py runs it


def _layer_floats(s: Shape) -> int:
    """float32 values per token alive in one layer of a forward in inference mode: the residual
    stream, the block's normed input and its output (3 D); then the larger of the attention's
    q, k, v, the rotated q and k, k and v repeated to every query head (a copy), the output and
    its transposed copy, the output projection; and the MLP's gate activation, up projection,
    their product (3 x MLP) and its output."""
    d, q, kv = s.d_model, s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = (q + 2 * kv) + (q + kv) + 2 * q + 2 * q + d
    return 3 * d + max(attention, 3 * s.mlp + d)


def _chunk_rows(s: Shape, batch: int, keys: int, cap: int | None = None) -> int:
    """Query rows in one exact chunk (stream.py: at least one row, else _CHUNK_ELEMENTS scores)."""
    rows = max(1, _CHUNK_ELEMENTS // (batch * s.heads * keys))
    return min(rows, cap) if cap else rows


def scan_terms(s: Shape, length: int) -> dict[str, int]:
    """bench_ratios.py's scan at ``length``: max(1, 4,096 // length) sequences a batch. Capture
    streams one layer at a time, so per token only one layer's activations are alive. Its four
    detectors read (query, key) pairs, so no score row is computed: every row goes through the
    fused kernel with its log-sum-exp (on the CPU a causal chunk needs no mask slice; elsewhere one
    slice of at most 2^26 / H floats, a few MB), and each pair's weight is ``exp(q.k x scale -
    lse)``, from the query and key vectors gathered per pair: about B x T pairs per detector,
    [n, H, d_head] float32 three times (query, key, product), one detector at a time. The
    detectors keep per-head sums and their targets as coordinates (no [T, T] map). One term does
    grow with T^2 outside a chunk: the boolean causal mask [B, 1, T, T] that transformers'
    ``sdpa_mask`` builds for the streaming attention (1 byte a pair, held through the forward)."""
    batch = max(1, SCAN_TOKENS // length)
    return {
        "one layer's activations": _layer_floats(s) * batch * length * F32,
        "causal mask B x T^2 bool": batch * length * length,
        "one detector's pair gathers": 3 * batch * length * s.heads * s.head_dim * F32,
    }


def describe_terms(s: Shape, length: int) -> dict[str, int]:
    """describe with windows of ``length`` tokens, 4 windows a forward and 4 per split, its
    default 64 query rows a window in blocks of 16 (exact; the other rows through the fused
    kernel, whose mask slice is at most 2^26 / H floats: a few MB). Besides one layer's
    activations and the causal mask, as scan: one exact query chunk's scores (at most 16 rows,
    fewer where _CHUNK_ELEMENTS says; 4 float32 copies: scores, softmax weights, two temporaries
    of the readers); the template maps of one chunk, [templates, B, rows, T] float32 four times
    (raw, masked, normalised, laid out by query; the cache keeps up to 256 MB of chunks); and the
    evaluation split's per-head strongest key and its weight at every position of every window
    (int32 and float16: 6 bytes x layers x heads x T per window). The shipped texts must also be
    long enough to cut such windows from; that is not a question of memory."""
    batch = DESCRIBE_BATCH
    rows = _chunk_rows(s, batch, length, cap=BLOCK)
    maps = 4 * len(TEMPLATES) * batch * rows * length * F32
    return {
        "one layer's activations": _layer_floats(s) * batch * length * F32,
        "causal mask B x T^2 bool": batch * length * length,
        "one query chunk's scores": SCORE_COPIES * batch * s.heads * rows * length * F32,
        "template maps": max(maps, _CACHE_BYTES),
        "eval strongest keys": DESCRIBE_WINDOWS * s.layers * s.heads * length * 6,
    }


def qk_terms(s: Shape, length: int) -> dict[str, int]:
    """What qk's pull-back holds for one window of T tokens (float64 unless said; the budgets are
    imported from headscope): the pass's recording, float32 (every block's input, every layer's
    heads' outputs and attention input, 3 x L x T x D; and the mask among the attention's call
    arguments, T^2 bytes); the layers waiting for a pass over the blocks' writes (their pull-backs,
    H x T x D a layer, and on the evaluation split each head's kept top-source writes: its first
    6 key sources and 2 groups, at most 8 H x T x D a layer), at most WAITING_BYTES or one layer,
    whichever is larger; one backward's autograd (PULLBACK_BYTES); one block's rebuilt writes (at
    most BLOCK_BYTES) and the pass's buffer of writes with its flat copy (BLOCK_BYTES)."""
    layer = s.heads * length * s.d_model * F64
    kept = 8 * s.heads * length * s.d_model * F64
    return {
        "recorded inputs and outputs (float32)": 3 * s.layers * length * s.d_model * F32,
        "causal mask T^2 bool": length * length,
        "waiting layers: pull-backs": max(WAITING_BYTES, layer),
        "waiting layers: evaluation's kept writes": min(kept, max(WAITING_BYTES, kept // s.heads)),
        "one backward's autograd": PULLBACK_BYTES,
        "one block's writes and the pass's buffer": min(BLOCK_BYTES, (s.heads + 1) * length * s.d_model * F64)
        + BLOCK_BYTES,
    }


def qk_refused_above(s: Shape) -> int:
    """The longest window qk accepts for the last layer's heads: it refuses when what the pass
    records (3 x L x T x D float32, qk._check_memory) passes MAX_SOURCE_BYTES."""
    return MAX_SOURCE_BYTES // (3 * s.layers * s.d_model * F32)


PAPER = {
    "qk": qk_terms,
    "scan": scan_terms,
    "describe": describe_terms,
}


def largest(s: Shape, terms: Callable[[Shape, int], dict[str, int]], budget: int, step: int = 256):
    """The largest multiple of ``step`` whose weights, process and ``terms`` fit ``budget`` bytes,
    with its terms (0 and the terms at ``step`` when none fits)."""
    fixed = s.parameters * F32 + PROCESS
    best, length = 0, step
    while fixed + sum(terms(s, length).values()) <= budget and length <= 1 << 22:
        best, length = length, length + step
    return best, terms(s, best or step)


def paper(budget_gb: float) -> str:
    budget = int(budget_gb * 1e9)
    lines = [
        f"On paper: the largest context each analysis fits in {budget_gb:g} GB (10^9 bytes), float32 weights "
        f"and {PROCESS / 1e9:.0f} GB for the process, rounded down to a multiple of 256 "
        "(the terms are in bench_shapes.py's docstrings)",
        "",
        f"{'shape':<20} {'params':>7}  {'weights':>8}  {'analysis':<26} {'context':>8}  dominant term there",
    ]
    for s in SHAPES:
        weights = s.parameters * F32
        for name, terms in PAPER.items():
            best, found = largest(s, terms, budget)
            if weights + PROCESS > budget:
                dominant = f"weights alone: {weights / 1e9:.1f} GB"
            else:
                term = max(found, key=found.get)
                dominant = f"{term}: {found[term] / 1e9:.2f} GB"
            lines.append(
                f"{s.name:<20} {s.parameters / 1e9:>6.2f}B  {weights / 1e9:>5.1f} GB  {name:<26} "
                f"{f'{best:,}' if best else 'none':>8}  {dominant}"
            )
    lines.append("")
    lines += [
        f"qk refuses the last layer's heads of {s.name} on windows above {qk_refused_above(s):,} "
        f"tokens, BOS included (qk._check_memory: what the pass records, 3 x L x T x D float32 > "
        f"{MAX_SOURCE_BYTES / 2**30:.0f} GiB)"
        for s in SHAPES
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="build/llama-1b-shape")
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument(
        "--only",
        default="scan,describe,qk",
        help=f"comma-separated, of {', '.join(ANALYSES)}, run in this order at each length",
    )
    parser.add_argument(
        "--qk-every-up-to",
        type=int,
        help="qk on every head only up to this length; above it, the heads of --qk-heads, one row each",
    )
    parser.add_argument("--qk-heads", default="L15H0", help="comma-separated heads (with --qk-every-up-to)")
    parser.add_argument("--machine", default=f"{len(os.sched_getaffinity(0))}-core CPU")
    parser.add_argument("--json", type=Path, help="also write the measurements here (after every row)")
    parser.add_argument("--table", type=Path, help="print the table of an earlier --json and stop")
    parser.add_argument("--paper", action="store_true", help="print the on-paper context limits and stop")
    parser.add_argument("--budget-gb", type=float, default=24.0, help="memory for --paper (10^9 bytes)")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    if args.paper:
        print(paper(args.budget_gb))
        return
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(ANALYSES)
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ANALYSES)}")
    if args.json:  # refused now, not after the measuring
        check_writable(args.json, "--json", force=True)

    def save(data: dict) -> None:
        if args.json:
            write_atomic(args.json, json.dumps(data, indent=1) + "\n", "--json", force=True)

    data = measure(
        args.model,
        [int(x) for x in args.lengths.split(",")],
        only,
        args.machine,
        save,
        args.qk_every_up_to,
        [h.strip() for h in args.qk_heads.split(",") if h.strip()],
    )
    save(data)
    print(table(data))


if __name__ == "__main__":
    main()
