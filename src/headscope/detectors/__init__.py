"""The detector registry: every head role headscope knows, keyed by name.

A new attention-pattern role is one declaration (a :class:`TargetDetector`, or a ``Detector``
subclass with its RoleSpec) added here, by a plugin's entry point (group ``headscope.detectors``),
or at run time by ``hs.register``; the scan, the role rule, the role map, the legends, the reports
and ``--verify`` read everything from :data:`REGISTRY`.
"""

from __future__ import annotations

from typing import Any

from headscope.detectors.base import Detector, DetectorResult, RoleSpec
from headscope.detectors.circuits import IOIAttentionDetector, RetrievalDetector
from headscope.detectors.coref import CorefDetector
from headscope.detectors.functionvector import FunctionVectorScore
from headscope.detectors.induction import DuplicateTokenDetector, InductionDetector
from headscope.detectors.kvcache import LongRangeDetector
from headscope.detectors.positional import PreviousTokenDetector, SinkDetector
from headscope.detectors.syntax import SyntaxDetector
from headscope.detectors.target import PatternDetector, TargetDetector, Targets, check_name, check_source
from headscope.errors import InputError
from headscope.registry import Registry

# The scan's parts that run their own detectors on their own data (syntax(), coref(), ioi(), …).
BUILT_IN_PARTS = ("treebank", "coref", "ioi", "retrieval")
# A detector is declared either as a Detector subclass (the full contract: syntax, coreference) or
# as a declaration instance (TargetDetector, PatternDetector); calling either gives a fresh one to run.
Declaration = type[Detector] | Detector


def _accept(obj: Any) -> Declaration:
    """``obj`` if it declares a detector, else TypeError saying what a declaration is."""
    if isinstance(obj, type) and issubclass(obj, Detector):
        if getattr(obj, "__abstractmethods__", None):
            raise TypeError(
                f"detector class {obj.__name__} does not implement {', '.join(sorted(obj.__abstractmethods__))}"
            )
        for attribute in ("name", "summary"):
            if not isinstance(getattr(obj, attribute, None), str):
                raise TypeError(f"detector class {obj.__name__} declares no {attribute}")
        check_name(obj.name)
        if obj.default_source not in BUILT_IN_PARTS:  # the scan's own parts read their own sets
            check_source(obj.default_source, obj.name)
        return obj
    if isinstance(obj, PatternDetector):
        raise TypeError(
            f"{obj!r} holds one pattern per prompt of its own: run it with hs.detect, not in a scan"
        )
    if isinstance(obj, Detector) and callable(obj):
        return obj
    raise TypeError(
        f"{obj!r} is not a detector: give a headscope.TargetDetector, or a headscope.Detector subclass"
    )


def _label_taken(new: Declaration, registered: dict[str, Declaration]) -> str | None:
    """A role label names one role: the role map and the legends look roles up by it."""
    for spec in new.role_specs():
        for label in spec.labels():
            for name, other in registered.items():
                if not isinstance(other, PatternDetector) and any(
                    label.label == taken.label for s in other.role_specs() for taken in s.labels()
                ):
                    return f"its role label {label.label!r} is the label of detector {name!r}"
    return None


REGISTRY: Registry[Declaration] = Registry(
    "detector", "headscope.detectors", _accept, lambda d: d.name, _label_taken
)
for _builtin in (
    PreviousTokenDetector,
    DuplicateTokenDetector,
    InductionDetector,
    SinkDetector,
    SyntaxDetector,
    CorefDetector,
    IOIAttentionDetector,
    RetrievalDetector,
):
    REGISTRY.add_builtin(_builtin)


# Detectors whose scores do not come from a scan's attention maps (kv-plan's long-range mass, icl's
# function-vector AIE): never part of a scan, but their tables are described like the roles'.
SCORES: dict[str, type[Detector]] = {
    LongRangeDetector.name: LongRangeDetector,
    FunctionVectorScore.name: FunctionVectorScore,
}


# hs.detect's pattern detectors, by name: each belongs to the prompts its patterns were made for,
# so it never joins the scan's registry; kept here so that its tables' role, legend and summary are
# found (:func:`declared`). A second hs.detect of the same name replaces the first.
PATTERNS: dict[str, PatternDetector] = {}


def declared(name: str) -> Declaration | None:
    """The declaration behind a table's ``detector`` column: the registry's, a pattern's, or a
    score's (kv-plan's long-range mass); None for a name nobody declared."""
    return REGISTRY.get(name) or PATTERNS.get(name) or SCORES.get(name)


def create(names: list[str] | None = None) -> list[Detector]:
    """Instantiate detectors by name (every registered one when ``names`` is None). A pattern
    detector (``hs.detect``) holds one pattern per prompt of its own, so it never runs in a scan."""
    chosen = list(REGISTRY) if names is None else names
    own = [n for n in chosen if n in PATTERNS and n not in REGISTRY]
    unknown = [n for n in chosen if n not in REGISTRY and n not in own]
    if unknown:
        raise InputError(f"unknown detector {', '.join(unknown)}", hint=f"choose from {', '.join(REGISTRY)}")
    if own:
        raise InputError(
            f"detector {', '.join(own)} scores the prompts its pattern was made for (hs.detect), not a scan's data",
            hint="run hs.detect again, or declare a TargetDetector to scan",
        )
    return [REGISTRY[n]() for n in chosen]


__all__ = [
    "REGISTRY",
    "SCORES",
    "Declaration",
    "PATTERNS",
    "declared",
    "Detector",
    "DetectorResult",
    "PatternDetector",
    "RoleSpec",
    "TargetDetector",
    "Targets",
    "create",
]
