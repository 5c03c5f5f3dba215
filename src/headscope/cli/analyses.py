"""The analysis commands, derived from the registry: one per registered analysis, built-in or a
plugin's (entry-point group ``headscope.analyses``), unless it says it has none (``cli = False``).

Each is the analysis' options (its dataclass fields: flags, help texts, ranges, choices), the shared
groups it takes (``--top``, ``--capture``), its declared outputs (:class:`Output`: ``--html``,
``--png``, ``--out``), its summary as the help text, and one call of :func:`common.run_analysis`.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from pathlib import Path
from typing import Any

from headscope.analyses import ANALYSES
from headscope.core.registry import PluginWarning
from headscope.errors import InputError
from headscope.extend.protocol import Analysis, Output, option
from headscope.models import DEFAULT_MODEL
from headscope.outputs.writing import FOLDER_CHECKS, WRITERS, check_outputs

from .common import Capture, Csv, Emit, Load, ModelArg, Top, app, err, run_analysis, wrote
from .params import KEYWORD, command


def _show_plugin_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """A plugin left out is one line on stderr (the host's commands go on)."""
    if issubclass(category, PluginWarning):
        err.print(f"warning: {message}", soft_wrap=True, markup=False, highlight=False)
    else:
        _previous(message, category, *args, **kwargs)


_previous = warnings.showwarning
warnings.showwarning = _show_plugin_warning


def _outputs(analysis: Analysis, first: bool) -> type:
    """The analysis' declared outputs as an option group: ``--html PATH`` and the like."""
    fields = [
        (_param(o), Path | None, option(None, o.help, flag=o.flag))
        for o in analysis.outputs
        if o.first == first
    ]
    return dataclasses.make_dataclass("Outputs", fields, kw_only=True)


def _param(output: Output) -> str:
    return "out_" + output.flag.lstrip("-").replace("-", "_")


def _check_outputs(chosen: list[tuple[Output, Path]], options: Any, force: bool) -> None:
    """What the outputs need, before the options' own checks: a folder's own check, and ``needs``."""
    for output, path in chosen:
        if output.kind == "folder" and output.writer in FOLDER_CHECKS:
            for note in FOLDER_CHECKS[output.writer](path, options, force):  # type: ignore[index]
                err.print(f"note: {note}", soft_wrap=True)
        if output.needs is not None and not getattr(options, output.needs):
            check_outputs(force, (output.flag, path))
            needs = "--" + output.needs.replace("_", "-")
            raise InputError(output.refusal or f"{output.flag} needs {needs}", hint=output.hint)


def _command_for(analysis: Analysis) -> None:
    name = analysis.name

    def analysis_command(**given: Any) -> None:
        options, emit = given["options"], given["emit"]
        paths = dataclasses.asdict(given["first"]) | dataclasses.asdict(given["outputs"])
        chosen = [(o, paths[_param(o)]) for o in analysis.outputs if paths[_param(o)] is not None]
        _check_outputs(chosen, options, emit.force)
        result = run_analysis(
            name,
            given["model"],
            options,
            given["load"],
            emit,
            capture=given.get("capture"),
            top=given["top"].top if "top" in given else 10,
            csv=given["csv"].csv,
            outputs=tuple((o.flag, path) for o, path in chosen if o.kind == "file"),
        )
        for output, path in chosen:
            writer = WRITERS[output.writer] if isinstance(output.writer, str) else output.writer
            wrote(writer(result, path, emit.force))

    groups = {
        "options": analysis.options,
        "first": _outputs(analysis, first=True),
        "top": Top if analysis.takes_top else None,
        "csv": Csv,
        "outputs": _outputs(analysis, first=False),
        "emit": Emit,
        "load": Load,
        "capture": Capture if analysis.takes_capture else None,
    }
    by_position = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("model", by_position, default=DEFAULT_MODEL, annotation=ModelArg)]
    params += [inspect.Parameter(n, KEYWORD, annotation=g) for n, g in groups.items() if g is not None]
    analysis_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    analysis_command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    origin = ANALYSES.origin(name)
    plugin = "" if origin == "built-in" else f" (plugin: {origin.removeprefix('plugin ')})"
    analysis_command.__doc__ = analysis.summary + plugin
    analysis_command.__name__ = name.replace("-", "_")
    command(app, name)(analysis_command)


def add_analysis_commands() -> None:
    """One command per registered analysis that has none yet (and can be one). Both registries are
    read here, so a broken plugin of either kind is named once, whatever the command. The API is
    imported first: a plugin that imports headscope while it loads finds it whole."""
    import headscope.api  # noqa: F401
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
