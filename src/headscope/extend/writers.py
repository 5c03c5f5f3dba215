"""File writers an analysis' outputs (:class:`~headscope.extend.protocol.Output`) may name: the
ones several analyses share (the HTML report, the role table). Each writes atomically
(:mod:`headscope.files`) and returns what it wrote, as the text after "wrote " (None: nothing).

A writer may carry ``name`` (what a plugin's ``Output(..., writer="html")`` names) and, for a folder,
``check_folder(path, options, force) -> notes``: its own check before the model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from headscope import files

Writer = Callable[[Any, Path, bool], "str | None"]


def named(
    name: str, check_folder: Callable[[Path, Any, bool], list[str]] | None = None
) -> Callable[[Writer], Writer]:
    """Decorator: give a writer the name a plugin's Output may use, and a folder's own check."""

    def mark(writer: Writer) -> Writer:
        writer.name = name  # type: ignore[attr-defined]
        if check_folder is not None:
            writer.check_folder = check_folder  # type: ignore[attr-defined]
        return writer

    return mark


def html_file(path: Path, document: str, force: bool) -> str:
    written = files.write_atomic(path, document, "--html", force)
    return f"{written} ({len(document.encode('utf-8')) / 1e6:.1f} MB)"


@named("html")
def html_report(result: Any, path: Path, force: bool) -> str:
    """``--html``: the HTML report, with attention heatmaps."""
    return html_file(path, result.html(examples=True), force)


@named("html-grid")
def html_grid(result: Any, path: Path, force: bool) -> str:
    """``--html``: the HTML report without heatmaps (a grid of its own carries the page)."""
    return html_file(path, result.html(examples=False), force)


@named("roles-csv")
def roles_csv(result: Any, path: Path, force: bool) -> str:
    """``--roles-csv``: one row per head, its role and the score behind it."""
    return str(files.write_atomic(path, result.to_csv(roles=True), "--roles-csv", force))
