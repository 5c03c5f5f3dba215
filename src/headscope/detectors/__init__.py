"""The detector registry: every head role headscope knows, keyed by name.

A new attention-pattern role is one detector module (the class, with its RoleSpec), one line here,
and its test: the role rule, the role map, the legends and ``--verify`` read the spec from here.
"""

from __future__ import annotations

from headscope.detectors.base import Detector, DetectorResult, RoleSpec
from headscope.detectors.circuits import IOIAttentionDetector, RetrievalDetector
from headscope.detectors.coref import CorefDetector
from headscope.detectors.induction import DuplicateTokenDetector, InductionDetector
from headscope.detectors.kvcache import LongRangeDetector
from headscope.detectors.positional import PreviousTokenDetector, SinkDetector
from headscope.detectors.syntax import SyntaxDetector

REGISTRY: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        PreviousTokenDetector,
        DuplicateTokenDetector,
        InductionDetector,
        SinkDetector,
        SyntaxDetector,
        CorefDetector,
        IOIAttentionDetector,
        RetrievalDetector,
    )
}


# Detectors that score heads without naming a role (kv-plan's long-range mass): never part of a
# scan, but their tables are described like the roles'.
SCORES: dict[str, type[Detector]] = {LongRangeDetector.name: LongRangeDetector}


def create(names: list[str] | None = None) -> list[Detector]:
    """Instantiate detectors by name (all registered ones when ``names`` is None)."""
    from headscope.errors import InputError

    chosen = list(REGISTRY) if names is None else names
    unknown = [n for n in chosen if n not in REGISTRY]
    if unknown:
        raise InputError(f"unknown detector {', '.join(unknown)}", hint=f"choose from {', '.join(REGISTRY)}")
    return [REGISTRY[n]() for n in chosen]


__all__ = ["REGISTRY", "SCORES", "Detector", "DetectorResult", "RoleSpec", "create"]
