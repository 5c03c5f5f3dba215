"""headscope: what does every attention head in a transformer do?

    import headscope as hs
    result = hs.scan("smollm2-135m")            # or hs.scan(model, tokenizer) for a model you loaded
    result.top("induction", 5)

The names below load on first use, so ``import headscope`` stays cheap (no torch until needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = (
    "load",
    "run",
    "plan",
    "scan",
    "induction",
    "syntax",
    "coref",
    "retrieval",
    "ioi",
    "kv_plan",
    "weights",
    "show",
    "sweep",
)
__all__ = [
    "HeadscopeError",
    "InputError",
    "Result",
    "__version__",
    "coref",
    "induction",
    "ioi",
    "kv_plan",
    "load",
    "plan",
    "retrieval",
    "run",
    "scan",
    "show",
    "sweep",
    "syntax",
    "weights",
]

if TYPE_CHECKING:  # pragma: no cover
    from headscope.api import (
        coref,
        induction,
        ioi,
        kv_plan,
        load,
        plan,
        retrieval,
        run,
        scan,
        show,
        sweep,
        syntax,
        weights,
    )
    from headscope.api.result import Result
    from headscope.errors import HeadscopeError, InputError


def __getattr__(name: str) -> Any:
    if name in _API:
        from headscope import api

        return getattr(api, name)
    if name == "Result":
        from headscope.api.result import Result

        return Result
    if name in ("HeadscopeError", "InputError"):
        from headscope import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'headscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
