"""Writing the CLI's output files: the paths checked before any work, ``--format`` rendered, and the
writers an analysis' declared outputs (:class:`headscope.analyses.protocol.Output`) name.

Every writer writes atomically (:mod:`headscope.files`) and returns what it wrote, as the text after
"wrote " (None: nothing written); the CLI prints it on stderr.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from headscope import files
from headscope.errors import InputError


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


def render(
    fmt: str, draw: Callable[[Console], None], csv_text: Callable[[], str], json_data: Callable[[], dict]
) -> str:
    """``--format`` table (plain text), csv or json, as the text to write."""
    from headscope.outputs import report

    if fmt == "table":
        return report.render_text(draw)
    if fmt == "csv":
        return csv_text()
    return json.dumps(report.jsonable(json_data()), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def command_line() -> str:
    """The command that made this output, as a shell line (shown in HTML reports): the headscope
    command being run as the CLI parsed it (sys.argv is another program's when the CLI runs
    in-process); sys.argv only outside any command."""
    from headscope.outputs.html import COMMAND_LINE

    return COMMAND_LINE.get() or "headscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def html_file(path: Path, document: str, force: bool) -> str:
    written = files.write_atomic(path, document, "--html", force)
    return f"{written} ({len(document.encode('utf-8')) / 1e6:.1f} MB)"


def table_file(path: Path, table: Any, force: bool, columns: list[str] | None = None) -> str:
    """``--csv``: every row of ``table``."""
    from headscope.outputs import report

    written = files.write_atomic(path, report.table_csv(table, columns), "--csv", force)
    return f"{len(table)} rows to {written}"


# --- the writers the analyses' outputs name (they live above the analyses) ---------------------------

Writer = Callable[[Any, Path, bool], "str | None"]


def _roles_csv(result: Any, path: Path, force: bool) -> str:
    return str(files.write_atomic(path, result.to_csv(roles=True), "--roles-csv", force))


def _html(examples: bool) -> Writer:
    def write(result: Any, path: Path, force: bool) -> str:
        return html_file(path, result.html(command=command_line(), examples=examples), force)

    return write


def _ablation_json(result: Any, path: Path, force: bool) -> str | None:
    if not result.checks:
        return None
    text = json.dumps(result.checks[0].to_json(), indent=2) + "\n"
    return str(files.write_atomic(path, text, "--json", force))


def _needle_png(result: Any, path: Path, force: bool) -> str:
    from headscope.outputs import views

    with files.atomic_path(path, "--png", force) as tmp:
        views.save_needle_png(result.state["needle"], tmp, f"{result.model}: {result.state['title']}")
    return str(path)


def _icl_png(result: Any, path: Path, force: bool) -> str:
    from headscope.outputs import views

    with files.atomic_path(path, "--png", force) as tmp:
        views.save_icl_png(result.state["measures"], tmp, f"{result.model}: next-token loss by position")
    return str(path)


def _plan_folder(result: Any, path: Path, force: bool) -> str:
    from headscope.outputs import kvplan

    written = kvplan.write_plan_dir(result.kv_plan, path, force)
    return f"{len(written)} files to {Path(path)}"


def _check_plan_folder(path: Path, options: Any, force: bool) -> list[str]:
    from headscope.analyses.kvplan import parse_sparsities
    from headscope.outputs import kvplan

    return [
        f"--out {path}: {name}/ is an earlier run's plan; this run leaves it as it is"
        for name in kvplan.check_plan_dir(path, force, parse_sparsities(str(options.sparsity)))
    ]


WRITERS: dict[str, Writer] = {
    "roles-csv": _roles_csv,
    "html": _html(examples=True),
    "html-grid": _html(examples=False),
    "ablation-json": _ablation_json,
    "needle-png": _needle_png,
    "icl-png": _icl_png,
    "plan-folder": _plan_folder,
}
# A folder's own check before the model loads (a file joins the check of --csv and -o): its notes.
FOLDER_CHECKS: dict[str, Callable[[Path, Any, bool], list[str]]] = {"plan-folder": _check_plan_folder}
