"""The causal checks the analyses return from ``verify``, and the helpers their modules share.

A :class:`Check` is one causal check: ``value`` is the analysis' own record, whose type picks its
printer in ``outputs`` (``report.check_printers``); ``kind`` names it in the analysis' JSON; and
``to_json`` is what the result JSON carries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from headscope.errors import InputError

from .protocol import Analysis, Outcome


@dataclass
class Check:
    """One causal check: ``value`` is the analysis' own record (its type picks the printer);
    ``kind`` names the check in the analysis' JSON."""

    kind: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        from .ablation import Verification

        if isinstance(self.value, Verification):
            value = self.value
            return {
                **dataclasses.asdict(value),
                "topk_effect": value.topk_effect,
                "random_effect": value.random_effect,
            }
        return self.value.to_json()


def _one_check(outcome: Outcome, kind: str) -> dict[str, Any] | None:
    """The JSON of the analysis' one check of ``kind`` (None when it was not run)."""
    check = next((c for c in outcome.checks if c.kind == kind), None)
    return None if check is None else check.to_json()


def _too_many(loaded: Any, k: int, option_name: str, what: str) -> None:
    total = loaded.layout.n_layers * loaded.layout.n_heads
    if k > total // 2:
        raise InputError(
            f"{option_name} {k} leaves too few heads for {what}", hint=f"use at most {total // 2}"
        )


class _TableChecked(Analysis):
    """Analyses whose tables ``Result.verify`` checks by token-loss ablation, as ``scan --verify`` does."""

    def verify(
        self, loaded: Any, outcome: Outcome, options: Any, progress: Any, k: int | None = None
    ) -> list[Check]:
        from .ablation import verify as verify_tables

        checks = verify_tables(loaded, outcome.report, k=k or 3, seed=options.seed, progress=progress)
        return [Check("table", c) for c in checks]
