"""Commands for the analyses the built-in commands do not cover: plugins' (entry-point group
``headscope.analyses``), derived from the registry like everything else an analysis gets.

Each is the analysis' options (its dataclass fields: flags, help texts, ranges, choices), the
shared model, output and load options, and one call of :func:`common.run_analysis`.
"""

from __future__ import annotations

import warnings
from typing import Any

from headscope.analyses.protocol import ANALYSES, Analysis

from .common import DEFAULT_MODEL, Capture, Csv, Emit, Load, ModelArg, Top, app, err, run_analysis
from .params import command


def _show_plugin_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """A plugin left out is one line on stderr (the host's commands go on)."""
    from headscope.registry import PluginWarning

    if issubclass(category, PluginWarning):
        err.print(f"warning: {message}", soft_wrap=True, markup=False, highlight=False)
    else:
        _previous(message, category, *args, **kwargs)


_previous = warnings.showwarning
warnings.showwarning = _show_plugin_warning


def _command_for(analysis: Analysis) -> None:
    name = analysis.name

    def analysis_command(
        model: ModelArg = DEFAULT_MODEL,
        *,
        options: Any,
        top: Top,
        csv: Csv,
        emit: Emit,
        load: Load,
        capture: Capture,
    ) -> None:
        run_analysis(name, model, options, load, emit, capture=capture.capture, top=top.top, csv=csv.csv)

    analysis_command.__annotations__ = {
        "model": ModelArg,
        "options": analysis.options,
        "top": Top,
        "csv": Csv,
        "emit": Emit,
        "load": Load,
        "capture": Capture,
        "return": None,
    }
    analysis_command.__doc__ = f"{analysis.summary} (plugin: {ANALYSES.origin(name).removeprefix('plugin ')})"
    analysis_command.__name__ = name.replace("-", "_")
    command(app, name)(analysis_command)


def add_plugin_commands() -> None:
    """One command per registered analysis that has no command yet (and can be one). Both registries
    are read here, so a broken plugin of either kind is named once, whatever the command."""
    from headscope.detectors import REGISTRY

    len(REGISTRY)
    taken = {
        info.name or (info.callback.__name__ if info.callback else "") for info in app.registered_commands
    }
    for name, analysis in ANALYSES.items():
        if analysis.cli and name not in taken and name.replace("-", "_") not in taken:
            _command_for(analysis)


add_plugin_commands()
