"""Writing the CLI's output files: the paths checked before any work, ``--format`` rendered, and the
writers an analysis' declared outputs (:class:`headscope.extend.protocol.Output`) name.

Every writer writes atomically (:mod:`headscope.files`) and returns what it wrote, as the text after
"wrote " (None: nothing written); the CLI prints it on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from headscope import files
from headscope.errors import InputError
from headscope.extend.writers import Writer
from headscope.extend.writers import html_file as html_file  # re-exported: headscope report writes with it


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


def table_file(path: Path, table: Any, force: bool, columns: list[str] | None = None) -> str:
    """``--csv``: every row of ``table``."""
    from headscope.outputs import report

    written = files.write_atomic(path, report.table_csv(table, columns), "--csv", force)
    return f"{len(table)} rows to {written}"


# --- the writers the analyses' outputs name: each lives beside its analysis --------------------------


class _Named(Mapping[str, Writer]):
    """The writers a plugin's ``Output(..., writer="html")`` may name: every built-in analysis'
    writer that carries a ``name`` (:func:`headscope.extend.writers.named`). Read from the
    analyses when asked, so there is no table to keep in step."""

    def _found(self) -> dict[str, Writer]:
        from headscope.analyses import ANALYSES
        from headscope.extend import writers

        found = {
            w.name: w
            for w in (writers.html_report, writers.html_grid, writers.roles_csv)  # type: ignore[attr-defined]
        }
        for analysis in ANALYSES.builtins().values():
            for output in analysis.outputs:
                name = getattr(output.writer, "name", None)
                if callable(output.writer) and isinstance(name, str):
                    found.setdefault(name, output.writer)
        return found

    def __getitem__(self, name: str) -> Writer:
        return self._found()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._found())

    def __len__(self) -> int:
        return len(self._found())


class _FolderChecks(Mapping[Any, Callable[[Path, Any, bool], list[str]]]):
    """A folder output's own check before the model loads, by its writer (a callable, or a name of
    :data:`WRITERS`): the writer's ``check_folder``."""

    def _writer(self, writer: Any) -> Any:
        return WRITERS.get(writer) if isinstance(writer, str) else writer

    def __contains__(self, writer: object) -> bool:
        return callable(getattr(self._writer(writer), "check_folder", None))

    def __getitem__(self, writer: Any) -> Callable[[Path, Any, bool], list[str]]:
        if writer not in self:
            raise KeyError(writer)
        return self._writer(writer).check_folder

    def __iter__(self) -> Iterator[Any]:
        return iter([w for w in WRITERS.values() if w in self])

    def __len__(self) -> int:
        return len(list(iter(self)))


WRITERS: Mapping[str, Writer] = _Named()
FOLDER_CHECKS: Mapping[Any, Callable[[Path, Any, bool], list[str]]] = _FolderChecks()


def output_group(analysis: Any, first: bool) -> type:
    """An analysis' declared outputs as an option group (``--html PATH`` and the like; no path: not
    written): those listed right after its options (``first``: the run's figure or plan), or the rest."""
    from headscope.extend.protocol import option

    fields = [
        (_param(o), Path | None, option(None, o.help, flag=o.flag))
        for o in analysis.outputs
        if o.first == first
    ]
    return dataclasses.make_dataclass("Outputs", fields, kw_only=True)


def _param(output: Any) -> str:
    return "out_" + output.flag.lstrip("-").replace("-", "_")


def chosen_outputs(analysis: Any, *groups: Any) -> list[tuple[Any, Path]]:
    """The declared outputs of ``analysis`` given a path in ``groups`` (of :func:`output_group`)."""
    paths = {name: path for group in groups for name, path in dataclasses.asdict(group).items()}
    return [(o, paths[_param(o)]) for o in analysis.outputs if paths[_param(o)] is not None]


def unknown_writers(analysis: Any) -> list[str]:
    """The flags of the outputs of ``analysis`` that name no writer of :data:`WRITERS`."""
    return [o.flag for o in analysis.outputs if isinstance(o.writer, str) and o.writer not in WRITERS]


def check_declared(
    chosen: list[tuple[Any, Path]], options: Any, force: bool, on_note: Callable[[str], None]
) -> None:
    """What an analysis' chosen outputs (:class:`headscope.extend.protocol.Output`, path) need, before
    the options' own checks and before the model loads: a folder's own check (its notes to
    ``on_note``), and ``needs`` (the option it needs, set)."""
    for output, path in chosen:
        if output.kind == "folder" and output.writer in FOLDER_CHECKS:
            for text in FOLDER_CHECKS[output.writer](path, options, force):
                on_note(text)
        if output.needs is not None and not getattr(options, output.needs):
            check_outputs(force, (output.flag, path))
            needs = "--" + output.needs.replace("_", "-")
            raise InputError(output.refusal or f"{output.flag} needs {needs}", hint=output.hint)


def write_declared(result: Any, chosen: list[tuple[Any, Path]], force: bool) -> Iterator[str | None]:
    """Each chosen output written by its writer; yields what each wrote (see the writers)."""
    for output, path in chosen:
        writer = WRITERS[output.writer] if isinstance(output.writer, str) else output.writer
        yield writer(result, path, force)
