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
from headscope.extend.protocol import Analysis, Output, option
from headscope.models import DEFAULT_MODEL
from headscope.outputs.terminal import show_plugin_warnings
from headscope.outputs.writing import WRITERS, check_declared, write_declared

from .common import Capture, Csv, Emit, Load, ModelArg, Top, app, note, run_analysis, wrote
from .params import KEYWORD, command

show_plugin_warnings()


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


def _command_for(analysis: Analysis) -> None:
    name = analysis.name

    def analysis_command(**given: Any) -> None:
        options, emit = given["options"], given["emit"]
        paths = dataclasses.asdict(given["first"]) | dataclasses.asdict(given["outputs"])
        chosen = [(o, paths[_param(o)]) for o in analysis.outputs if paths[_param(o)] is not None]
        check_declared(chosen, options, emit.force, note)
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
        for what in write_declared(result, chosen, emit.force):
            wrote(what)

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
