"""Heads that attend from a closing bracket or quote to the one that opened it.

Two detectors, each one declaration (``headscope.TargetDetector``), and one analysis (a
``headscope.Analysis`` with its options), found by headscope through this package's entry points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import headscope as hs
from headscope.analyses.base import score_prompt_set
from headscope.data.prompts import load_texts

PAIRS = {")": "(", "]": "[", "}": "{", "）": "（", "」": "「", "》": "《"}
SAME = {'"'}  # a quote closes the last open quote of the same kind
PROMPTS = Path(__file__).parent / "brackets.txt"


OPENING = set(PAIRS.values())


def _bare(token: str) -> str:
    """A token string without the tokenizer's word-start mark (Ġ in byte-level BPE, ▁ in SentencePiece)."""
    return token.replace("Ġ", "").replace("▁", "").strip()


def bracket_targets(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, queries, keys): from each token that closes a bracket or quote to the token that
    opened it. Tokens are read character by character, so "),", "(\"" and ")." count; a pair
    inside one token ("()") and unmatched brackets give no target."""
    rows, queries, keys = [], [], []
    for row in range(batch.input_ids.shape[0]):
        stack: list[tuple[str, int]] = []
        for position, token in enumerate(batch.tokens(row)):
            for char in _bare(token):
                closes = PAIRS.get(char) or (
                    char if char in SAME and stack and stack[-1][0] == char else None
                )
                if closes is not None and stack and stack[-1][0] == closes:
                    opened_at = stack.pop()[1]
                    if opened_at != position:
                        rows.append(row), queries.append(position), keys.append(opened_at)
                elif char in OPENING or char in SAME:
                    stack.append((char, position))
    found = {(r, q, k) for r, q, k in zip(rows, queries, keys, strict=True)}  # one target per pair of tokens
    rows, queries, keys = (list(part) for part in zip(*sorted(found), strict=True)) if found else ([], [], [])
    return (
        torch.tensor(rows, dtype=torch.long),
        torch.tensor(queries, dtype=torch.long),
        torch.tensor(keys, dtype=torch.long),
    )


CLOSING_BRACKET = hs.TargetDetector(
    "closing-bracket",
    targets=bracket_targets,
    summary="attention from a closing bracket or quote to the one it closes",
    source=str(PROMPTS),
    role=hs.RoleSpec(
        "brkt",
        "closing bracket -> its opening bracket",
        "#12b886",
        "green",
        data="bracket prompts",
        verify="text",
    ),
)


def offset_targets(offset: int):
    """Attention from position i to i - offset, where both are ordinary tokens."""

    def targets(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        content = batch.content
        rows, earlier = (content[:, offset:] & content[:, :-offset]).nonzero(as_tuple=True)
        return rows, earlier + offset, earlier

    return targets


# An entry point may name a list: one declaration per offset.
OFFSETS = [
    hs.TargetDetector(f"offset-{k}", targets=offset_targets(k), summary=f"attention from position i to i-{k}")
    for k in (2, 3)
]


@dataclass(kw_only=True)
class BracketOptions(hs.Stats):
    text: str | Path | None = hs.option(
        None,
        "Prompts with brackets and quotes (.yaml/.jsonl/.txt; default: the plugin's own).",
        cli_type=Path | None,
    )
    batch_size: int = hs.option(8, "Sequences per forward pass.", min=1)


class Brackets(hs.Analysis):
    """closing-bracket and the offsets 1-3 on one prompt set: is a bracket head more than a positional one?"""

    name = "brackets"
    summary = "Closing-bracket heads against position-only heads (offsets 1-3), on prompts with brackets."
    options = BracketOptions

    def check(self, options: BracketOptions) -> Any:
        return load_texts(options.text if options.text is not None else PROMPTS)

    def run(self, loaded: Any, options: BracketOptions, prepared: Any, progress: Any) -> hs.Outcome:
        from headscope.detectors import REGISTRY

        chosen = [CLOSING_BRACKET(), REGISTRY["previous-token"](), *(d() for d in OFFSETS)]
        report = score_prompt_set(
            loaded,
            prepared,
            chosen,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return hs.Outcome(report)
