"""What every command shares: the app, option groups declared once, errors, loading, the analysis run.

Printing and writing are :mod:`headscope.outputs.terminal`'s (no typer there: a script can use them)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from headscope.errors import MAX_MESSAGE, HeadscopeError, NotApplicable, elide
from headscope.extend.protocol import ENTRY, option
from headscope.models.options import LoadOptions, load_group
from headscope.outputs.progress import INTERRUPTED
from headscope.outputs.terminal import (  # noqa: F401  (the commands' printing, re-exported)
    BROKEN_PIPE_EXIT,
    PLAIN,
    Emit,
    err,
    loading,
    note,
    out,
    print_result,
    quiet_broken_pipe,
    run_progress,
    say,
    setup_logging,
    write_output,
    wrote,
)
from headscope.outputs.writing import check_outputs

app = typer.Typer(
    name="headscope",
    help="Find out what every attention head in a transformer does.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ModelArg = Annotated[
    str,
    typer.Argument(
        help="Bundled alias (smollm2-135m, minilm-l6), a .gguf file, a local HF folder, or a cached hub id."
    ),
]


# --- option groups, each declared once (the load options: LoadOptions' fields) ------------------------

Device = load_group("Device", "device")
Where = load_group("Where", "device", "dtype")
_PROFILE = option(False, "Print on stderr where the time went: loading, each step, the output.")
Load = load_group("Load", "device", "dtype", "device_map", extra=(("profile", bool, _PROFILE),))
Capture = load_group("Capture", "capture")


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


def _on_sigint(signum: int, frame: Any) -> None:
    INTERRUPTED.append(signum)  # checked between batches (see outputs.progress.CheckedBars)
    raise KeyboardInterrupt


@contextlib.contextmanager
def handle_errors(debug: bool) -> Iterator[None]:
    """Known errors become one line on stderr and exit 2 (input) or 1 (failure); Ctrl-C exits 130."""
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


def load_model(model: str, options: LoadOptions) -> Any:
    import headscope.api as hs  # here, not above: the plugins it loads warn through analyses' hook

    with loading(model) as on_loaded:
        loaded = hs.load(model, **dataclasses.asdict(options))
        on_loaded(loaded)
    return loaded


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
    """Every analysis command: check, load, run (and verify) through the API, then print and write
    (:func:`headscope.outputs.terminal.print_result`); returns the result (for its own output files)."""
    import headscope.api as hs

    entry = ENTRY.set("cli")  # refusals name --flags, not keywords
    try:
        planned = hs.plan_options(name, options)  # every bad input is refused before the model loads
        check_outputs(emit.force, ("-o", emit.output), ("--csv", csv), *outputs)
        started = time.perf_counter()
        loaded = load_model(model, LoadOptions.from_groups(load, capture))
        loaded_seconds = time.perf_counter() - started
        with run_progress(emit, top) as (progress, printed):
            result = hs.run(name, loaded, planned=planned, progress=progress, profile=load.profile)
        start = printed.sections if printed is not None else 0
        print_result(name, result, emit, top=top, start=start, csv=csv, load_seconds=loaded_seconds)
        return result
    finally:
        ENTRY.reset(entry)
