"""What every command shares: the app, option groups declared once, errors, progress, output."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from headscope import files
from headscope.analyses.protocol import option
from headscope.errors import MAX_MESSAGE, HeadscopeError, InputError, NotApplicable, elide

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
    profile: bool = option(False, "Print on stderr where the time went: loading, each step, the output.")


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


_INTERRUPTED: list[int] = []  # signals received; checked between batches (see progress_bar)


def _on_sigint(signum: int, frame: Any) -> None:
    _INTERRUPTED.append(signum)
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
        _INTERRUPTED.clear()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


class PrintedParts:
    """Prints a run's finished parts to stdout while it goes on; counts the sections it printed."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.sections = 0
        self.holding = False

    def show(self, part: Any, bars: Any) -> None:
        from headscope.outputs import report

        self.holding = self.holding or report.decided_by_whole_run(part)
        if self.holding:
            return
        with bars.paused():
            report.print_report(part, out, self.top)
            out.file.flush()
        self.sections += len(part.sections)


def profile_line(loaded: float, timings: dict[str, float], run: float, output: float) -> str:
    """``--profile``: seconds per step, the rest of the run (checks, set-up) and the total."""
    steps = [("load", loaded), *timings.items()]
    rest = run - sum(timings.values())
    if timings:
        steps.append(("other (checks, set-up)", rest))
    else:
        steps.append(("run", run))
    steps += [("output", output), ("total", loaded + run + output)]
    return "profile: " + " · ".join(f"{name} {seconds:.1f} s" for name, seconds in steps)


class CheckedBars:
    """The progress reporter the CLI hands to a run: bars on stderr that also stop the run at the
    next batch after a swallowed Ctrl-C, and ``on_part`` for finished parts (None: not wanted)."""

    def __init__(self, bars: Any) -> None:
        self.bars = bars
        self.on_part: Callable[[Any], None] | None = None

    def __call__(self, label: str, total: int) -> Callable[[int], None]:
        advance = self.bars(label, total)

        def step(n: int) -> None:
            # A Ctrl-C whose KeyboardInterrupt Python swallowed (raised inside a finaliser or a
            # callback that ignores exceptions) still stops the run at the next batch.
            if _INTERRUPTED:
                raise KeyboardInterrupt
            advance(n)

        return step

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return self.bars.paused()


@contextlib.contextmanager
def progress_bar() -> Iterator[CheckedBars]:
    from headscope.outputs.progress import progress_bars

    with progress_bars(err) as bars:
        yield CheckedBars(bars)


def load_model(model: str, load: Load, capture: str = "auto", revision: str | None = None) -> Any:
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
    err.print(f"{loaded.name}: {layout.describe()}, {kind}, capture={loaded.capture_mode}", soft_wrap=True)
    return loaded


def check_outputs(force: bool, *pairs: tuple[str, str | Path | None]) -> None:
    """Reject unwritable, clashing or (without --force) existing output paths before any work."""
    seen: dict[Path, str] = {}
    for flag, path in pairs:
        if path is None or str(path) == "-":
            continue
        target = files.check_writable(path, flag, force).resolve()
        if target in seen:
            raise InputError(f"{flag} and {seen[target]} both write {path}", hint="give each its own file")
        seen[target] = flag


def wrote(path: Path, what: str = "") -> None:
    err.print(f"wrote {what}{path}", soft_wrap=True)


def write_output(
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


def write_html(path: Path, document: str, force: bool) -> None:
    written = files.write_atomic(path, document, "--html", force)
    err.print(f"wrote {written} ({len(document.encode('utf-8')) / 1e6:.1f} MB)", soft_wrap=True)


def command_line() -> str:
    return "headscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def run_analysis(
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
    from headscope.analyses.protocol import ENTRY

    entry = ENTRY.set("cli")  # refusals name --flags, not keywords
    try:
        _run_analysis(name, model, options, load, emit, capture, top, csv, outputs, after)
    finally:
        ENTRY.reset(entry)


def _run_analysis(
    name: str,
    model: str,
    options: Any,
    load: Load,
    emit: Emit,
    capture: str,
    top: int,
    csv: Path | None,
    outputs: tuple[tuple[str, Path | None], ...],
    after: Callable[[Any], None] | None,
) -> None:
    import headscope.api as hs
    from headscope.outputs import report

    with handle_errors(emit.debug):
        planned = hs.plan_options(name, options)  # every bad input is refused before the model loads
        check_outputs(emit.force, ("-o", emit.output), ("--csv", csv), *outputs)
        started = time.perf_counter()
        loaded = load_model(model, load, capture)
        loaded_seconds = time.perf_counter() - started
        with progress_bar() as progress:
            # Tables go out as their part finishes (scan), unless a later table would hold roles
            # that the whole run decides (the IOI tables); from there on, the rest waits for the end.
            printed = PrintedParts(top) if emit.fmt == "table" and emit.output == "-" else None
            if printed is not None:
                progress.on_part = lambda part: printed.show(part, progress)
            started = time.perf_counter()
            result = hs.run(name, loaded, planned=planned, progress=progress)
            run_seconds = time.perf_counter() - started
        started = time.perf_counter()
        write_output(
            emit,
            lambda console: report.print_result(
                result, console, top, start=printed.sections if printed is not None else 0
            ),
            lambda: report.table_csv(result.table),
            lambda: result.to_dict(name),
        )
        if load.profile:
            err.print(
                profile_line(
                    loaded_seconds, result.report.timings, run_seconds, time.perf_counter() - started
                ),
                soft_wrap=True,
            )
        for note in result.notes:
            err.print(f"note: {note}", soft_wrap=True)
        if csv is not None:
            path = files.write_atomic(csv, report.table_csv(result.table), "--csv", emit.force)
            err.print(f"wrote {len(result.table)} rows to {path}", soft_wrap=True)
        if after is not None:
            after(result)
