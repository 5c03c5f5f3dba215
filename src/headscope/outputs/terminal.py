"""A command's terminal and output files: data on stdout (a broken pipe ends quietly), messages on
stderr, the spinner while a model loads, ``--format`` rendered to stdout or ``-o FILE``, the files
written, the cost ledger and the notes.

The CLI prints through these; nothing here knows its parser, so a script or a notebook can print a
result as the command does (``print_result``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from headscope import files
from headscope.core import held
from headscope.errors import MAX_MESSAGE, HeadscopeError, NotApplicable, elide
from headscope.extend.protocol import option

from .progress import INTERRUPTED, PROFILE_NOTE, CheckedBars, PrintedParts, checked_bars, profile_line
from .writing import render, table_file

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


def _is_devnull(fd: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(os.devnull))
    except OSError:
        return False


def run_program(program: Callable[[], Any]) -> None:
    """Run a command-line program (the typer app): quiet third-party bars unless ``--debug``, and a
    reader of stdout that went away (``| head -1``) ends it with :data:`BROKEN_PIPE_EXIT`, quietly."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "--debug" not in sys.argv:
        # The GGUF converter draws its own tqdm bar; tqdm reads this when it is imported.
        os.environ.setdefault("TQDM_DISABLE", "1")
        quiet_library_deprecations()
    stdout_was_devnull = _is_devnull(1)
    try:
        program()
    except BrokenPipeError:
        quiet_broken_pipe()
        sys.exit(BROKEN_PIPE_EXIT)
    except SystemExit as exc:
        # typer's own output (--help, usage) goes through a Rich console that, on a broken pipe,
        # points stdout at devnull and exits 1; give it the broken-pipe status as well.
        if exc.code == 1 and not stdout_was_devnull and _is_devnull(1):
            sys.exit(BROKEN_PIPE_EXIT)
        raise


def quiet_library_deprecations() -> None:
    """Deprecation notices (FutureWarning, DeprecationWarning) are for the libraries' own users,
    not for a user of the command line: a newer transformers or peft than the constraints file
    names warns above headscope's one-line messages. ``--debug`` shows them."""
    import warnings

    for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)


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


def note(text: str) -> None:
    err.print(f"note: {text}", soft_wrap=True)


def wrote(what: str | Path | None) -> None:
    """A file written (what a writer of :mod:`headscope.outputs.writing` returns; None: none)."""
    if what is not None:
        err.print(f"wrote {what}", soft_wrap=True)


def setup_logging(debug: bool) -> None:
    """headscope's log on stderr: warnings, or everything (and transformers' own) with ``debug``."""
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
def reported(debug: bool, passing: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """A command's errors as the command line says them: known errors become one line on stderr and
    exit 2 (input) or 1 (failure), Ctrl-C exits 130, a closed stdout 141 (``SystemExit``); the
    traceback only with ``debug``. ``passing``: exceptions that go through as they are (the parser's
    own exits)."""
    setup_logging(debug)
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
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("interrupted: no partial output file was left behind")
        raise SystemExit(130) from None
    except passing:
        raise
    except BrokenPipeError:  # the reader of stdout went away (| head -1): end quietly
        quiet_broken_pipe()
        raise SystemExit(BROKEN_PIPE_EXIT) from None
    except Exception as exc:  # an unexpected failure: one line, the traceback only with --debug
        if debug:
            traceback.print_exc(file=sys.stderr)
        err.print(
            f"[red]error:[/red] unexpected {type(exc).__name__}: {escape(elide(str(exc), MAX_MESSAGE))} (rerun with --debug for the traceback)",
            markup=True,
            soft_wrap=True,
        )
        raise SystemExit(1) from None
    finally:
        INTERRUPTED.clear()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def loading(model: str) -> Iterator[Callable[[Any], None]]:
    """A spinner on stderr while ``model`` loads (on a terminal), ended by the ``on_loaded(loaded)``
    this yields (hs.show's and hs.run's, or called after hs.load), which prints the loaded model's layout
    (held, as the log is, while an analysis command checks the model: :mod:`headscope.core.held`)."""
    status = err.status(f"loading {model} … (a GGUF is dequantized once, then read from the cache)")
    if not PLAIN:
        status.start()

    def on_loaded(loaded: Any) -> None:
        status.stop()
        kind = "causal" if loaded.is_causal else "bidirectional"
        line = f"{loaded.name}: {loaded.layout.describe()}, {kind}, capture={loaded.capture_mode}"
        held.show(lambda: err.print(line, soft_wrap=True))  # an analysis' refusal stays one line

    try:
        with held.holding():  # show's refusal (--layer 30) stays one line too; an analysis holds already
            yield on_loaded
    finally:
        status.stop()


def print_profile(profile: Any, load_seconds: float, output_started: float) -> None:
    """``--profile``: the run's cost ledger (``hs.run(..., profile=True)``), after the output."""
    output_seconds = time.perf_counter() - output_started
    err.print(profile_line(load_seconds, profile.costs, output_seconds), soft_wrap=True)
    err.print(PROFILE_NOTE, soft_wrap=True)


@dataclass(kw_only=True)
class Emit:
    """Where a command's data goes, and in which form."""

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

    @property
    def streamed(self) -> bool:
        """Tables for people on stdout: printed as they come."""
        return self.fmt == "table" and self.output == "-"


@dataclass(kw_only=True)
class Top:
    top: int = option(10, "Heads to show per table.", min=1)


@dataclass(kw_only=True)
class Csv:
    csv: Path | None = option(None, "Write every head of every detector to this CSV (atomic).")


@dataclass(kw_only=True)
class Debug:
    debug: bool = option(False, "Show tracebacks and debug logs.")


def write_output(
    emit: Emit, draw: Callable[[Console], None], csv_text: Callable[[], str], json_data: Callable[[], dict]
) -> None:
    """Data to stdout (or -o FILE, atomically); messages go to stderr."""
    if emit.streamed:
        draw(out)
        return
    text = render(emit.fmt, draw, csv_text, json_data)
    if emit.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        wrote(f"{emit.fmt} to {files.write_atomic(emit.output, text, '-o', emit.force)}")


def print_result(
    name: str,
    result: Any,
    emit: Emit,
    *,
    top: int = 10,
    start: int = 0,
    csv: Path | None = None,
    load_seconds: float = 0.0,
) -> None:
    """An analysis' result as its command gives it: ``--format`` to stdout or ``-o`` (the tables from
    section ``start`` on: those before were printed as their part finished), the cost ledger where
    the run has one, the notes, and ``--csv``."""
    from . import report

    started = time.perf_counter()
    write_output(
        emit,
        lambda console: report.print_result(result, console, top, start=start),
        lambda: report.table_csv(result.table),
        lambda: result.to_dict(name),
    )
    if result.profile is not None:
        print_profile(result.profile, load_seconds, started)
    for text in result.notes:
        note(text)
    if csv is not None:
        wrote(table_file(csv, result.table, emit.force))


def print_compared(comparison: Any, emit: Emit, csv: Path | None = None) -> None:
    """``headscope compare``'s output of ``hs.compare``: ``--format`` to stdout or ``-o``, ``--csv``
    the joined per-head table."""
    from . import report
    from .compare import JOINED_COLUMNS

    write_output(
        emit,
        lambda console: report.print_comparison(comparison, console),
        lambda: report.table_csv(comparison.joined, JOINED_COLUMNS),
        lambda: report.comparison_json(comparison),
    )
    if csv is not None:
        wrote(table_file(csv, comparison.joined, emit.force, JOINED_COLUMNS))


@contextlib.contextmanager
def run_progress(emit: Emit, top: int) -> Iterator[tuple[CheckedBars, PrintedParts | None]]:
    """What a command hands ``hs.run``: progress bars on stderr (a swallowed Ctrl-C stops the run at
    the next batch) and, where tables for people go to stdout, each part's tables printed as the
    part finishes, unless a later table would hold roles that the whole run decides (the IOI
    tables): from there on, the rest waits for the end. ``PrintedParts.sections``: those printed."""
    with checked_bars(err) as progress:
        printed = PrintedParts(out, top) if emit.streamed else None
        if printed is not None:
            progress.on_part = lambda part: printed.show(part, progress)
        yield progress, printed


def show_plugin_warnings() -> None:
    """From now on, a plugin left out is one line on stderr (the host's commands go on), not
    Python's warning with its source line."""
    import warnings

    from headscope.core.registry import PluginWarning

    previous = warnings.showwarning

    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, PluginWarning):
            err.print(f"warning: {message}", soft_wrap=True, markup=False, highlight=False)
        else:
            previous(message, category, *args, **kwargs)

    warnings.showwarning = show
