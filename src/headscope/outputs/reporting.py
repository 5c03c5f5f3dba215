"""``headscope report``: a saved result (``Result.from_json``) as a self-contained HTML report, with
the attention heatmaps of its model where that model loads. Its options are declared here, beside
the code that reads them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from headscope.errors import HeadscopeError, InputError
from headscope.extend.protocol import option

from .terminal import note, wrote
from .writing import command_line, html_file


@dataclass(kw_only=True)
class ReportOptions:
    html: Path = option(MISSING, "Where the self-contained HTML report goes.")
    model: str | None = option(None, "Model for the attention heatmaps (default: the one the result names).")
    examples: bool = option(
        True, "Compute the attention heatmaps (loads the model).", flag="--examples/--no-examples"
    )
    run: str | None = option(
        None, "Sweep store: the run's key or model label (default: the last finished run)."
    )
    force: bool = option(False, "Overwrite output files that already exist.")


def check_given(paths: list[Path], options: ReportOptions) -> list[Path]:
    """``paths``, once checked before anything is read or written: refused, an input the page would
    leave out: a third result, ``--model`` for two results (their page draws no model's heatmaps,
    only their cards') or with ``--no-examples``, ``--run`` where no sweep store is given (it picks
    a run of one)."""
    if len(paths) > 2:
        raise InputError(
            f"report: {len(paths)} results given; it draws one, or two describe results side by side",
            hint="one page per result: headscope report RESULT --html PAGE",
        )
    if len(paths) == 2 and options.model is not None:
        raise InputError(
            "report: --model names the model of one result's heatmaps; two describe results are drawn "
            "with their cards' heatmaps, from no model",
            hint="leave --model out",
        )
    if options.model is not None and not options.examples:
        raise InputError(
            "report: --model names the model of the heatmaps, and --no-examples leaves them out",
            hint="leave one of them out",
        )
    if options.run is not None and not any(Path(path).expanduser().is_dir() for path in paths):
        raise InputError(
            "report: --run picks a run of a sweep store, and no sweep store is given",
            hint="give the store's folder, or leave --run out",
        )
    return paths


def write_report(
    results: Any, options: ReportOptions, load: Callable[[str], Any], given: int | None = None
) -> None:
    """Write a saved result's HTML report to ``options.html``; with ``options.examples``, the heatmaps
    of the model ``load(spec)`` gives (``--model``, or the one the result names). A model that cannot
    be loaded leaves them out, with a note in the report and on stderr. ``results``: one result, or
    a list of one or two (two describe results: one page, the second drawn beside the first, its
    cards' heatmaps standing in for the examples; any other pair is refused, by ``Result.html``,
    before anything is written); ``given``: how many the user named."""
    results = results if isinstance(results, list) else [results]
    if (given or len(results)) > 2:
        raise InputError(
            f"report: {given or len(results)} results given; it draws one, or two describe results side by side"
        )
    saved = results[0]
    notes: list[str] = []
    if len(results) == 2:
        document = saved.html(examples=False, command=command_line(), beside=results[1])
        wrote(html_file(options.html, document, options.force))
        return
    if options.examples:
        try:
            spec = options.model or str(saved.to_dict().get("spec") or saved.model)
            saved.attach(load(spec))
        except HeadscopeError as exc:
            notes.append(f"attention heatmaps left out: {exc}")
    document = saved.html(examples=options.examples, command=command_line(), notes=notes)
    for text in notes:
        note(text)
    wrote(html_file(options.html, document, options.force))
