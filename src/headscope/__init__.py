"""headscope: what does every attention head in a transformer do?

    import headscope as hs
    result = hs.scan("smollm2-135m")            # or hs.scan(model, tokenizer) for a model you loaded
    result.top("induction", 5)

The names below load on first use, so ``import headscope`` stays cheap (no torch until needed).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The names to extend headscope with and the API's own functions. The analyses' functions (hs.scan,
# hs.kv_plan, … one per registered analysis) come from the registry: ``__all__`` is computed on first
# use (star-import and dir() read it), so ``import headscope`` stays cheap; the generated
# __init__.pyi gives editors every keyword (tests/unit/test_api_stub.py).
_API = (
    "Analysis",
    "Check",
    "Detector",
    "Outcome",
    "Output",
    "PatternDetector",
    "RoleSpec",
    "Stats",
    "TargetDetector",
    "Template",
    "compare",
    "load",
    "option",
    "plan",
    "register",
    "run",
    "show",
    "sweep",
)
_ROOT = ("HeadscopeError", "InputError", "Result", "__version__")


def __getattr__(name: str) -> Any:
    if name == "__all__":
        from headscope.api import ANALYSIS_FUNCTIONS

        return sorted([*_ROOT, *_API, *ANALYSIS_FUNCTIONS])
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
    return __getattr__("__all__")
