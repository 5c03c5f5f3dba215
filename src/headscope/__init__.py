"""headscope: what does every attention head in a transformer do?

    import headscope as hs
    result = hs.scan("smollm2-135m")            # or hs.scan(model, tokenizer) for a model you loaded
    result.top("induction", 5)

The names below load on first use, so ``import headscope`` stays cheap (no torch until needed).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The analyses' functions (one per registered analysis: hs.scan, hs.kv_plan, …) and the names to
# extend headscope with. Kept as a list here so that ``import headscope`` stays cheap;
# tests/unit/test_api_stub.py checks it against the registry, and the generated __init__.pyi gives
# editors every keyword.
_ANALYSES = ("coref", "detect", "induction", "ioi", "kv_plan", "retrieval", "scan", "syntax", "weights")
_API = (
    "Analysis",
    "Detector",
    "Outcome",
    "PatternDetector",
    "RoleSpec",
    "Stats",
    "TargetDetector",
    "load",
    "option",
    "plan",
    "register",
    "run",
    "show",
    "sweep",
    *_ANALYSES,
)
__all__ = sorted(["HeadscopeError", "InputError", "Result", "__version__", *_API])


def __getattr__(name: str) -> Any:
    if name in ("HeadscopeError", "InputError"):
        from headscope import errors

        return getattr(errors, name)
    if name == "Result":
        from headscope.api.result import Result

        return Result
    if name in _API or (not name.startswith("_") and not _is_submodule(name)):
        from headscope import api

        try:  # a plugin's or a run-time analysis: hs.<its name>
            return getattr(api, name)
        except AttributeError:
            pass
    raise AttributeError(f"module 'headscope' has no attribute {name!r}")


def _is_submodule(name: str) -> bool:
    """``from headscope import capture`` asks this module first: a subpackage is not an API name."""
    from pathlib import Path

    here = Path(__file__).parent
    return (here / name).is_dir() or (here / f"{name}.py").is_file()


def __dir__() -> list[str]:
    return sorted(__all__)
