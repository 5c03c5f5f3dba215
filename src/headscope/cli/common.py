"""What every command shares: the app, option groups declared once, errors, progress, output."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from headscope import files
from headscope.errors import MAX_MESSAGE, HeadscopeError, NotApplicable, elide
from headscope.extend.protocol import ENTRY, option
from headscope.models.options import LoadOptions, spec_default
from headscope.outputs.progress import INTERRUPTED, PROFILE_NOTE, PrintedParts, checked_bars, profile_line
from headscope.outputs.writing import check_outputs, render, table_file

app = typer.Typer(
    name="headscope",
    help="Find out what every attention head in a transformer does.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# The reader of our stdout went away (``headscope … | head -1``): every command ends quietly, with
# nothing on stderr, and the status a shell gives a process killed by SIGPIPE (128 + 13), as cat,
# grep and ls do, so a pipeline under ``set -o pipefail`` still sees that the output was cut.
BROKEN_PIPE_EXIT = 141


def quiet_broken_pipe() -> None:
    """Point stdout at devnull: Python's flush at exit would otherwise fail again and print
    "Exception ignored ... BrokenPipeError" on stderr."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


class _Stdout(Console):
    """Rich's console for data: a broken pipe ends the program with ``BROKEN_PIPE_EXIT``, not 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        quiet_broken_pipe()
        raise SystemExit(BROKEN_PIPE_EXIT)


# NO_COLOR (https://no-color.org) means plain text: no colours, no bold, no live progress bars.
# Without a terminal Rich already prints plain text.
PLAIN = bool(os.environ.get("NO_COLOR"))
out = _Stdout(highlight=False, color_system=None if PLAIN else "auto")
err = Console(stderr=True, highlight=False, color_system=None if PLAIN else "auto")


def say(text: str) -> None:
    """One message on stderr, as it is (no markup), unwrapped."""
    err.print(text, soft_wrap=True, markup=False)


ModelArg = Annotated[
    str,
    typer.Argument(
        help="Bundled alias (smollm2-135m, minilm-l6), a .gguf file, a local HF folder, or a cached hub id."
    ),
]


# --- option groups, each declared once ---------------------------------------------------------------


def _load_group(name: str, *names: str, extra: tuple[tuple[str, type, Any], ...] = ()) -> type:
    """Options of :class:`LoadOptions` (their help texts, choices and checks, declared there), at
    the defaults a spec loads with (``--device cpu``), and the command's own ``extra`` fields."""
    declared = {f.name: f for f in dataclasses.fields(LoadOptions)}
    fields = [
        (n, declared[n].type, field(default=spec_default(n), metadata=declared[n].metadata)) for n in names
    ]
    return dataclasses.make_dataclass(name, [*fields, *extra], kw_only=True)


Device = _load_group("Device", "device")
Where = _load_group("Where", "device", "dtype")
_PROFILE = option(False, "Print on stderr where the time went: loading, each step, the output.")
Load = _load_group("Load", "device", "dtype", "device_map", extra=(("profile", bool, _PROFILE),))
Capture = _load_group("Capture", "capture")


def load_options(*groups: Any) -> LoadOptions:
    """The load options the command line gave, from its groups."""
    given = {n: getattr(g, n) for g in groups for n in LoadOptions.names() if hasattr(g, n)}
    return LoadOptions(**given)


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
class Debug:
    debug: bool = option(False, "Show tracebacks and debug logs.")


# --- plumbing ----------------------------------------------------------------------------------------


def _setup_logging(debug: bool) -> None:
    logger = logging.getLogger("headscope")
    logger.handlers[:] = [RichHandler(console=err, show_path=debug, show_time=False)]
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    if not debug:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def _on_sigint(signum: int, frame: Any) -> None:
    INTERRUPTED.append(signum)  # checked between batches (see outputs.progress.CheckedBars)
    raise KeyboardInterrupt


@contextlib.contextmanager
def handle_errors(debug: bool) -> Iterator[None]:
    """Known errors become one line on stderr and exit 2 (input) or 1 (failure); Ctrl-C exits 130."""
    _setup_logging(debug)
    previous = None
    with contextlib.suppress(ValueError):  # not in the main thread (a test runner): keep Python's own
        previous = signal.signal(signal.SIGINT, _on_sigint)
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
    except BrokenPipeError:  # the reader of stdout went away (| head -1): end quietly
        quiet_broken_pipe()
        raise typer.Exit(BROKEN_PIPE_EXIT) from None
    except Exception as exc:  # an unexpected failure: one line, the traceback only with --debug
        if debug:
            traceback.print_exc(file=sys.stderr)
        err.print(
            f"[red]error:[/red] unexpected {type(exc).__name__}: {escape(elide(str(exc), MAX_MESSAGE))} (rerun with --debug for the traceback)",
            markup=True,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    finally:
        INTERRUPTED.clear()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def loading(model: str) -> Iterator[Callable[[Any], None]]:
    """A spinner on stderr while ``model`` loads (on a terminal), ended by the ``on_loaded(loaded)``
    this yields (hs.show's, or called after hs.load), which prints the loaded model's layout."""
    status = err.status(f"loading {model} … (a GGUF is dequantized once, then read from the cache)")
    if not PLAIN:
        status.start()

    def on_loaded(loaded: Any) -> None:
        status.stop()
        kind = "causal" if loaded.is_causal else "bidirectional"
        layout = loaded.layout.describe()
        err.print(f"{loaded.name}: {layout}, {kind}, capture={loaded.capture_mode}", soft_wrap=True)

    try:
        yield on_loaded
    finally:
        status.stop()


def load_model(model: str, options: LoadOptions) -> Any:
    import headscope.api as hs  # here, not above: the plugins it loads warn through analyses' hook

    with loading(model) as on_loaded:
        loaded = hs.load(model, **dataclasses.asdict(options))
        on_loaded(loaded)
    return loaded


def print_profile(profile: Any, load_seconds: float, output_started: float) -> None:
    """``--profile``: the run's cost ledger (``hs.run(..., profile=True)``), after the output."""
    output_seconds = time.perf_counter() - output_started
    err.print(profile_line(load_seconds, profile.costs, output_seconds), soft_wrap=True)
    err.print(PROFILE_NOTE, soft_wrap=True)


def wrote(what: str | Path | None) -> None:
    """A file written (what a writer of :mod:`headscope.outputs.writing` returns; None: none)."""
    if what is not None:
        err.print(f"wrote {what}", soft_wrap=True)


def write_output(
    emit: Emit, draw: Callable[[Console], None], csv_text: Callable[[], str], json_data: Callable[[], dict]
) -> None:
    """Data to stdout (or -o FILE, atomically); messages go to stderr."""
    if emit.fmt == "table" and emit.output == "-":
        draw(out)
        return
    text = render(emit.fmt, draw, csv_text, json_data)
    if emit.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        wrote(f"{emit.fmt} to {files.write_atomic(emit.output, text, '-o', emit.force)}")


def run_analysis(
    name: str,
    model: str,
    options: Any,
    load: Any,
    emit: Emit,
    *,
    capture: Any = None,
    top: int = 10,
    csv: Path | None = None,
    outputs: tuple[tuple[str, Path | None], ...] = (),
) -> Any:
    """Every analysis command: check, load, run (and verify) through the API, render, write --csv;
    returns the result (for the analysis' own output files)."""
    import headscope.api as hs
    from headscope.outputs import report

    entry = ENTRY.set("cli")  # refusals name --flags, not keywords
    try:
        planned = hs.plan_options(name, options)  # every bad input is refused before the model loads
        check_outputs(emit.force, ("-o", emit.output), ("--csv", csv), *outputs)
        started = time.perf_counter()
        loaded = load_model(model, load_options(load, capture))
        loaded_seconds = time.perf_counter() - started
        with checked_bars(err) as progress:
            # Tables go out as their part finishes (scan), unless a later table would hold roles
            # that the whole run decides (the IOI tables); from there on, the rest waits for the end.
            printed = PrintedParts(out, top) if emit.fmt == "table" and emit.output == "-" else None
            if printed is not None:
                progress.on_part = lambda part: printed.show(part, progress)
            result = hs.run(name, loaded, planned=planned, progress=progress, profile=load.profile)
        started = time.perf_counter()
        start = printed.sections if printed is not None else 0
        write_output(
            emit,
            lambda console: report.print_result(result, console, top, start=start),
            lambda: report.table_csv(result.table),
            lambda: result.to_dict(name),
        )
        if result.profile is not None:
            print_profile(result.profile, loaded_seconds, started)
        for note in result.notes:
            err.print(f"note: {note}", soft_wrap=True)
        if csv is not None:
            wrote(table_file(csv, result.table, emit.force))
        return result
    finally:
        ENTRY.reset(entry)
