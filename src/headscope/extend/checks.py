"""The causal checks the analyses return from ``verify``, and the helpers their modules share.

A :class:`Check` is one causal check: ``value`` is the analysis' own record, whose type picks its
own printer (``print_to(console, top)``, beside its analysis); ``kind`` names it in the analysis' JSON; and
``to_json`` is what the result JSON carries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from headscope.errors import InputError

from .ablation import Verification
from .ablation import verify as verify_tables
from .protocol import Analysis, Outcome, spelled


@dataclass
class Check:
    """One causal check: ``value`` is the analysis' own record (it prints itself: ``print_to``);
    ``kind`` names the check in the analysis' JSON."""

    kind: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        if isinstance(self.value, Verification):
            value = self.value
            return {
                **dataclasses.asdict(value),
                "topk_effect": value.topk_effect,
                "random_effect": value.random_effect,
            }
        return self.value.to_json()


def one_check(outcome: Outcome, kind: str) -> dict[str, Any] | None:
    """The JSON of the analysis' one check of ``kind`` (None when it was not run)."""
    check = next((c for c in outcome.checks if c.kind == kind), None)
    return None if check is None else check.to_json()


def too_many(loaded: Any, k: int, option_name: str, what: str) -> None:
    """K heads ablated and K random heads beside them: at most half the model's heads. ``option_name``
    is the option's Python name (``verify_k``), spelled as the caller wrote it."""
    total = loaded.layout.n_layers * loaded.layout.n_heads
    if k > total // 2:
        raise InputError(
            f"{spelled(option_name.lstrip('-').replace('-', '_'), k)} leaves too few heads for {what} "
            f"({loaded.name} has {total} heads)",
            hint=f"use at most {total // 2}",
        )


def check_repeat_context(loaded: Any, options: Any) -> None:
    """The repeated-random-tokens protocol fits the model's context (BOS and copies counted)."""
    limit = loaded.max_positions
    tokenizer = loaded.tokenizer
    extra = 0  # the special tokens repeated_tokens adds: BOS (causal), or CLS and SEP (encoders)
    if getattr(options, "bos", None) is not False:
        if loaded.is_causal:
            extra = int(tokenizer.bos_token_id is not None)
        elif tokenizer.cls_token_id is not None:
            extra = 1 + int(tokenizer.sep_token_id is not None)
    length = extra + options.seq_len * options.repeat_seq
    if limit is not None and length > limit:
        raise InputError(
            f"{spelled('seq_len', options.seq_len)} x {spelled('repeat_seq', options.repeat_seq)} is "
            f"{length} tokens with special tokens, longer than {loaded.name}'s context of {limit} tokens",
            hint=f"use at most {(limit - extra) // options.repeat_seq} tokens per copy",
        )


class TableChecked(Analysis):
    """Analyses whose tables ``Result.verify`` checks by token-loss ablation, as ``scan --verify`` does.

    ``k`` heads per table: the caller's, else the options' ``verify_k``, else 3. ``verify_min_n``: the
    fewest counted positions a table needs to be checked (hs.detect counts prompts, not tokens)."""

    verify_min_n: ClassVar[int] = 20

    def verify(
        self, loaded: Any, outcome: Outcome, options: Any, progress: Any, k: int | None = None
    ) -> list[Check]:
        checks = verify_tables(
            loaded,
            outcome.report,
            k=k or getattr(options, "verify_k", 3),
            seed=options.seed,
            progress=progress,
            min_n=self.verify_min_n,
        )
        return [Check("table", c) for c in checks]
