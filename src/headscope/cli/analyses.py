"""The analysis commands, derived from the registry: one per registered analysis, built-in or a
plugin's (entry-point group ``headscope.analyses``), unless it says it has none (``cli = False``).

Each is the analysis' options (its dataclass fields: flags, help texts, ranges, choices), the shared
groups it takes (``--top``, ``--capture``), its declared outputs (:class:`Output`: ``--html``,
``--png``, ``--out``), its summary as the help text, and one call of :func:`common.run_analysis`.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from headscope.analyses import ANALYSES
from headscope.core.registry import PluginWarning
from headscope.extend.protocol import Analysis
from headscope.models import DEFAULT_MODEL
from headscope.outputs.terminal import Csv, Emit, Top, note, show_plugin_warnings, wrote
from headscope.outputs.writing import (
    check_declared,
    chosen_outputs,
    output_group,
    unknown_writers,
    write_declared,
)

from .common import Capture, Load, ModelArg, app, run_analysis
from .params import KEYWORD, command

show_plugin_warnings()


def _command_for(analysis: Analysis) -> None:
    name = analysis.name

    def analysis_command(**given: Any) -> None:
        options, emit = given["options"], given["emit"]
        chosen = chosen_outputs(analysis, given["first"], given["outputs"])
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
        "first": output_group(analysis, first=True),
        "top": Top if analysis.takes_top else None,
        "csv": Csv,
        "outputs": output_group(analysis, first=False),
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
        unknown = unknown_writers(analysis)
        if unknown:
            warnings.warn(
                f"analysis {name!r}: {', '.join(unknown)} names no known writer; left out",
                PluginWarning,
                stacklevel=1,
            )
            continue
        _command_for(analysis)


add_analysis_commands()
