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
from headscope import files
from headscope.data.prompts import load_texts
from headscope.extend.base import score_prompt_set
from headscope.extend.checks import Check
from headscope.extend.protocol import Output

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
    verify: bool = hs.option(
        False, "Compare the best bracket head with the best offset head (the bracket gap)."
    )


@dataclass
class BracketGap:
    """The plugin's own check: the best closing-bracket head against the best position-only head.
    It prints itself (``print_to``), as a built-in check does."""

    bracket: tuple[int, int, float] | None  # layer, head, score; None: not scored on this text
    offset: tuple[str, int, int, float]  # detector, layer, head, score

    @property
    def gap(self) -> float | None:
        return None if self.bracket is None else self.bracket[2] - self.offset[3]

    def to_json(self) -> dict[str, Any]:
        return {
            "bracket_head": None if self.bracket is None else list(self.bracket[:2]),
            "bracket_score": None if self.bracket is None else self.bracket[2],
            "offset_detector": self.offset[0],
            "offset_head": list(self.offset[1:3]),
            "offset_score": self.offset[3],
            "gap": self.gap,
        }

    def text(self) -> str:
        name, o_layer, o_head, o_score = self.offset
        if self.bracket is None:
            return f"bracket gap: closing-bracket not scored (no brackets in the text) vs {name} L{o_layer}H{o_head} {o_score:.3f}"
        layer, head, score = self.bracket
        return (
            f"bracket gap {self.gap:+.3f}: closing-bracket L{layer}H{head} {score:.3f} "
            f"vs {name} L{o_layer}H{o_head} {o_score:.3f}"
        )

    def print_to(self, console: Any, top: int = 10) -> None:
        console.print(self.text(), markup=False, highlight=False)


def write_gap(result: Any, path: Path, force: bool) -> str | None:
    """``headscope brackets --gap FILE``: the bracket gap as one line of text (needs --verify)."""
    gaps = [c.value for c in result.checks if isinstance(c, Check) and isinstance(c.value, BracketGap)]
    if not gaps:
        return None
    return str(files.write_atomic(path, gaps[0].text() + "\n", "--gap", force))


class Brackets(hs.Analysis):
    """closing-bracket and the offsets 1-3 on one prompt set: is a bracket head more than a positional one?"""

    name = "brackets"
    summary = "Closing-bracket heads against position-only heads (offsets 1-3), on prompts with brackets."
    options = BracketOptions
    outputs = (
        # a writer named as a built-in's (the HTML report, with this analysis' own section)
        Output("--html", "Write the HTML report (with the bracket gap's own section).", "html"),
        Output(
            "--gap",
            "Write the bracket gap (best bracket head vs best offset head) to this file.",
            write_gap,
            needs="verify",
        ),
    )

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

    def verify(self, loaded: Any, outcome: hs.Outcome, options: Any, progress: Any, k: Any = None) -> list:
        table = outcome.report.table
        best = table[table.detector == "closing-bracket"].dropna(subset=["score"])
        best = best.sort_values("score", ascending=False)
        offsets = table[table.detector.str.startswith("offset-") | (table.detector == "previous-token")]
        other = offsets.dropna(subset=["score"]).sort_values("score", ascending=False)
        if other.empty:
            return []
        b, o = (best.iloc[0] if len(best) else None), other.iloc[0]
        found = BracketGap(
            None if b is None else (int(b.layer), int(b["head"]), float(b.score)),
            (str(o.detector), int(o.layer), int(o["head"]), float(o.score)),
        )
        return [Check("bracket-gap", found)]

    def html_section(self, result: Any) -> str | None:
        """The plugin's own section of the HTML report, from the result's JSON (live or saved)."""
        gaps = result.to_dict().get("verification") or []
        if not gaps:
            return None
        gap = gaps[0]
        return (
            "<style>\n.bracket-gap { border-left: 4px solid #3b73c4; padding-left: 0.6rem; }\n</style>\n"
            '<section id="bracket-gap" class="bracket-gap" data-testid="bracket-gap"><h2>Bracket gap</h2>'
            f"<p>closing-bracket {gap['bracket_head'] or 'not scored'} against {gap['offset_detector']} "
            f"{gap['offset_head']}: gap {gap['gap'] if gap['gap'] is None else round(gap['gap'], 3)}</p></section>\n"
        )
