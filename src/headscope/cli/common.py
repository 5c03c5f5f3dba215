"""What every command shares: the app, option groups declared once, errors, loading, the analysis run.

Printing and writing are :mod:`headscope.outputs.terminal`'s (no typer there: a script can use them)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from headscope.core import held
from headscope.extend.protocol import ENTRY, option
from headscope.models.options import LoadOptions, load_group
from headscope.outputs.terminal import Emit, loading, print_result, reported, run_progress
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


# --- plumbing ----------------------------------------------------------------------------------------


def handle_errors(debug: bool) -> contextlib.AbstractContextManager[None]:
    """A command's errors as one line and an exit status (``reported``); typer's own exits go through."""
    return reported(debug, passing=(typer.Exit, typer.Abort))


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
    """Every analysis command: check, load, run (and verify) through the API, then print and write;
    returns the result. What loading and checking say waits for the checks (:mod:`headscope.core.held`)."""
    import headscope.api as hs

    entry = ENTRY.set("cli")  # refusals name --flags, not keywords
    try:
        planned = hs.plan_options(name, options)  # every bad input is refused before the model loads
        check_outputs(emit.force, ("-o", emit.output), ("--csv", csv), *outputs)
        with held.holding(enabled=not emit.debug):
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
