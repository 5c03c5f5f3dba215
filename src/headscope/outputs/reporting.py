"""``headscope report``: a saved result (``Result.from_json``) as a self-contained HTML report, with
the attention heatmaps of its model where that model loads. Its options are declared here, beside
the code that reads them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from headscope.errors import HeadscopeError
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


def write_report(saved: Any, options: ReportOptions, load: Callable[[str], Any]) -> None:
    """Write ``saved``'s HTML report to ``options.html``; with ``options.examples``, the heatmaps of
    the model ``load(spec)`` gives (``--model``, or the one the result names). A model that cannot
    be loaded leaves them out, with a note in the report and on stderr."""
    notes: list[str] = []
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
