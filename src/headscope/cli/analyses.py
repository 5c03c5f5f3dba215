"""The analysis commands, derived from the registry: one per registered analysis, built-in or a
plugin's (entry-point group ``headscope.analyses``), unless it says it has none (``cli = False``).

Each is the analysis' options (its dataclass fields: flags, help texts, ranges, choices), the shared
groups it takes (``--top``, ``--capture``), its declared outputs (:class:`Output`: ``--html``,
``--png``, ``--out``), its summary as the help text, and one call of :func:`common.run_analysis`.
"""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from headscope.analyses import ANALYSES
from headscope.errors import InputError
from headscope.extend.protocol import Analysis, Output
from headscope.outputs.writing import FOLDER_CHECKS, WRITERS, Writer, check_outputs
from headscope.registry import PluginWarning

from .common import (
    DEFAULT_MODEL,
    Capture,
    Csv,
    Emit,
    Load,
    ModelArg,
    Top,
    app,
    err,
    handle_errors,
    run_analysis,
    wrote,
)
from .params import command


def _show_plugin_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """A plugin left out is one line on stderr (the host's commands go on)."""
    if issubclass(category, PluginWarning):
        err.print(f"warning: {message}", soft_wrap=True, markup=False, highlight=False)
    else:
        _previous(message, category, *args, **kwargs)


_previous = warnings.showwarning
warnings.showwarning = _show_plugin_warning


def _param(output: Output) -> str:
    return "out_" + output.flag.lstrip("-").replace("-", "_")


def _writer(output: Output) -> Writer:
    """A writer of the table (:data:`WRITERS`) or a plugin's own ``writer(result, path, force)``."""
    return WRITERS[output.writer] if isinstance(output.writer, str) else output.writer


# --- one command per analysis ------------------------------------------------------------------------


def _command_for(analysis: Analysis) -> None:
    name = analysis.name

    def analysis_command(**given: Any) -> None:
        options, emit = given["options"], given["emit"]
        chosen = [(o, given[_param(o)]) for o in analysis.outputs if given[_param(o)] is not None]
        with handle_errors(emit.debug):  # what the outputs need, before the options' own checks
            for output, path in chosen:
                if output.kind == "folder" and output.writer in FOLDER_CHECKS:
                    for note in FOLDER_CHECKS[output.writer](path, options, emit.force):  # type: ignore[index]
                        err.print(f"note: {note}", soft_wrap=True)
                if output.needs is not None and not getattr(options, output.needs):
                    check_outputs(emit.force, (output.flag, path))
                    needs = "--" + output.needs.replace("_", "-")
                    raise InputError(output.refusal or f"{output.flag} needs {needs}", hint=output.hint)

        def after(result: Any) -> None:
            for output, path in chosen:
                wrote(_writer(output)(result, path, emit.force))

        run_analysis(
            name,
            given["model"],
            options,
            given["load"],
            emit,
            capture=given.get("capture"),
            top=given["top"].top if "top" in given else 10,
            csv=given["csv"].csv,
            outputs=tuple((o.flag, path) for o, path in chosen if o.kind == "file"),
            after=after if chosen else None,
        )

    def keyword(param: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
        return inspect.Parameter(
            param, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
        )

    extra = {
        o: keyword(_param(o), Annotated[Path | None, typer.Option(o.flag, help=o.help)], None)
        for o in analysis.outputs
    }
    params = [
        inspect.Parameter(
            "model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=DEFAULT_MODEL, annotation=ModelArg
        ),
        keyword("options", analysis.options),
        *(p for o, p in extra.items() if o.first),
        *([keyword("top", Top)] if analysis.takes_top else []),
        keyword("csv", Csv),
        *(p for o, p in extra.items() if not o.first),
        keyword("emit", Emit),
        keyword("load", Load),
        *([keyword("capture", Capture)] if analysis.takes_capture else []),
    ]
    analysis_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    analysis_command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    origin = ANALYSES.origin(name)
    plugin = "" if origin == "built-in" else f" (plugin: {origin.removeprefix('plugin ')})"
    analysis_command.__doc__ = analysis.summary + plugin
    analysis_command.__name__ = name.replace("-", "_")
    command(app, name)(analysis_command)


def add_analysis_commands() -> None:
    """One command per registered analysis that has none yet (and can be one). Both registries are
    read here, so a broken plugin of either kind is named once, whatever the command."""
    from headscope.detectors import REGISTRY

    len(REGISTRY)
    taken = {
        info.name or (info.callback.__name__ if info.callback else "") for info in app.registered_commands
    }
    for name, analysis in ANALYSES.items():
        if not analysis.cli or name in taken or name.replace("-", "_") in taken:
            continue
        unknown = [o.flag for o in analysis.outputs if isinstance(o.writer, str) and o.writer not in WRITERS]
        if unknown:
            warnings.warn(
                f"analysis {name!r}: {', '.join(unknown)} names no known writer; left out",
                PluginWarning,
                stacklevel=1,
            )
            continue
        _command_for(analysis)


add_analysis_commands()
