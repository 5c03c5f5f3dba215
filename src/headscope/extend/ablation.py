"""Causal confirmation: ablate heads and measure what in-context copying loses.

The protocol (``headscope induction --ablate K``): on the repeated-random-tokens sequences,
measure the mean next-token loss on the later copies

* with the model intact (clean),
* with the top-K induction heads ablated,
* with K random heads from the same layers ablated, over several random draws (the control).

A head is ablated by replacing its output (before the output projection) with zeros or with its
mean at each position over the whole set of sequences, taken in a clean calibration pass first
(so the result does not depend on ``--batch-size``). Each loss comes with a 95% bootstrap
interval over sequences.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headscope import capture
from headscope.errors import InputError
from headscope.extend.base import ProgressFactory, RepeatSpec, model_batches, repeated_tokens
from headscope.extend.copyloss import CopyLossMeter
from headscope.models import LoadedModel
from headscope.verdicts.heads import Head, random_control
from headscope.verdicts.roles import role_spec
from headscope.verdicts.stats import bootstrap_ratio_ci


@dataclass
class LossEstimate:
    mean: float
    ci: tuple[float, float]
    later_sum: torch.Tensor = field(repr=False)  # [E] per-sequence loss sums on later copies
    later_tokens: torch.Tensor = field(repr=False)  # [E]


@dataclass
class AblationResult:
    mode: str
    k: int
    clean: LossEstimate
    topk: LossEstimate
    random: LossEstimate  # pooled over the random draws
    random_draws: list[LossEstimate]
    topk_heads: list[Head]
    random_heads: list[list[Head]]

    @property
    def topk_effect(self) -> float:
        return self.topk.mean - self.clean.mean

    @property
    def random_effect(self) -> float:
        return self.random.mean - self.clean.mean

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope induction --ablate``)."""
        from .ablation_present import print_ablation

        print_ablation(self, console)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "k": self.k,
            "clean_loss": self.clean.mean,
            "clean_loss_ci": list(self.clean.ci),
            "topk_loss": self.topk.mean,
            "topk_loss_ci": list(self.topk.ci),
            "random_loss": self.random.mean,
            "random_loss_ci": list(self.random.ci),
            "random_draw_losses": [d.mean for d in self.random_draws],
            "topk_heads": [list(h) for h in self.topk_heads],
            "random_heads": [[list(h) for h in draw] for draw in self.random_heads],
        }


def _estimate(sums: torch.Tensor, tokens: torch.Tensor, n_resamples: int, seed: int) -> LossEstimate:
    low, high = bootstrap_ratio_ci(sums[:, None], tokens, n_resamples=n_resamples, seed=seed)
    return LossEstimate(float(sums.sum() / tokens.sum()), (float(low[0]), float(high[0])), sums, tokens)


def later_copy_loss(
    loaded: LoadedModel,
    batches: Sequence[capture.Batch],
    spec: RepeatSpec,
    offset: int,
    n_examples: int,
    ablation: capture.AblateHeads | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    meter = CopyLossMeter(offset, spec.seq_len, spec.repeats, n_examples)
    capture.run(loaded, batches, capture.Pass(reads=[capture.TokenLosses(meter)], edits=[ablation]))
    return meter.later_sum, meter.later_tokens


def ablate(
    loaded: LoadedModel,
    spec: RepeatSpec,
    top_heads: Sequence[Head],
    *,
    mode: str = "zero",
    draws: int = 5,
    batch_size: int = 16,
    n_resamples: int = 1000,
    progress: ProgressFactory | None = None,
) -> AblationResult:
    """Clean vs top-K vs random-K ablation on the repeated-token protocol."""
    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError("ablation measures next-token loss, so it needs a causal language model")
    if mode not in {"zero", "mean"}:
        raise InputError(f"--ablation must be zero or mean, got {mode!r}")
    if draws < 1:
        raise InputError(f"--draws must be at least 1, got {draws}")
    sequences, specials, offset = repeated_tokens(loaded, spec)
    batches = model_batches(loaded, sequences, specials, batch_size)
    n = len(sequences)
    rng = random.Random(spec.seed)
    random_heads = [random_control(top_heads, loaded.layout, rng) for _ in range(draws)]
    advance = progress("ablations", 2 + draws + (mode == "mean")) if progress else None
    means = None
    if mode == "mean":
        means = capture.head_output_means(
            loaded, batches, [*top_heads, *(h for d in random_heads for h in d)]
        )
        if advance:
            advance(1)

    def measure(ablation: capture.AblateHeads | None) -> tuple[torch.Tensor, torch.Tensor]:
        out = later_copy_loss(loaded, batches, spec, offset, n, ablation)
        if advance:
            advance(1)
        return out

    clean = measure(None)
    topk = measure(capture.AblateHeads.of(top_heads, mode, means))
    draw_results = [measure(capture.AblateHeads.of(heads, mode, means)) for heads in random_heads]
    seed = spec.seed
    pooled_sum = torch.stack([d[0] for d in draw_results]).sum(0)
    pooled_tokens = torch.stack([d[1] for d in draw_results]).sum(0)
    return AblationResult(
        mode,
        len(top_heads),
        _estimate(*clean, n_resamples, seed),
        _estimate(*topk, n_resamples, seed),
        _estimate(pooled_sum, pooled_tokens, n_resamples, seed),
        [_estimate(*d, n_resamples, seed) for d in draw_results],
        [tuple(h) for h in top_heads],  # type: ignore[misc]
        random_heads,
    )


# --- scan --verify --------------------------------------------------------------------------------


# The verification targets (RoleSpec.verify) measured here by next-token loss; any other target is
# a circuit measure (logit difference, needle accuracy, ordinal continuation) that the circuit's
# own analysis checks.
TOKEN_TARGETS = ("later-copies", "text", "dependents", "pronouns")
# Measured on the scan's token-level inputs, so always checked; the other targets only where a head
# earned the role, since every check costs (1 + draws) forward passes over the prompt set.
ALWAYS_CHECKED = ("later-copies", "text")


@dataclass
class Verification:
    """The causal check of one table: ablate its top-K heads, and K random same-layer heads."""

    data: str
    detector: str
    relation: str
    direction: str
    heads: list[Head]
    best_score: float
    target: str  # which tokens' loss was measured
    n_tokens: int
    clean: float
    topk: float
    random: float  # mean over the draws

    @property
    def topk_effect(self) -> float:
        return self.topk - self.clean

    @property
    def random_effect(self) -> float:
        return self.random - self.clean

    @staticmethod
    def print_group(checks: list[Verification], console: Any, k: int) -> None:
        """The table checks of a run, together as one table (an empty one: verified, none ran)."""
        from .ablation_present import print_verification

        print_verification(checks, console, k, "zero")


def _token_losses(
    loaded: LoadedModel, batches: Sequence[capture.Batch], ablation: capture.AblateHeads | None
) -> list[torch.Tensor]:
    """Per batch, [B, T] loss of predicting token t (NaN at t = 0)."""
    out: list[torch.Tensor] = []

    def on_token_loss(token_losses: torch.Tensor, batch: capture.Batch) -> None:
        losses = token_losses.cpu()
        out.append(torch.cat([torch.full((losses.shape[0], 1), float("nan")), losses], dim=1))

    capture.run(loaded, batches, capture.Pass(reads=[capture.TokenLosses(on_token_loss)], edits=[ablation]))
    return out


def _target_masks(
    batches: Sequence[capture.Batch],
    data: str,
    target: str,
    relation: str,
    repeat: tuple[RepeatSpec, int] | None,
) -> tuple[list[torch.Tensor], str]:
    """Which tokens' loss tells whether this table's heads matter (``target``: its RoleSpec.verify)."""
    masks = []
    for batch in batches:
        length = batch.input_ids.shape[1]
        mask = torch.zeros_like(batch.attention_mask)
        if target == "later-copies" and repeat is not None:
            spec, offset = repeat
            start, end = offset + spec.seq_len, offset + spec.seq_len * spec.repeats
            mask[:, start:end] = True
            what = "later copies of repeated random tokens"
        elif target == "text":
            mask = batch.attention_mask & ~batch.special
            what = f"every token of {data}"
        elif target == "dependents":
            for row, meta in enumerate(batch.meta):
                for dep, _, rel in meta["arcs"]:
                    if rel == relation:
                        mask[row, (meta["to_word"][:, dep] > 0).nonzero().flatten()] = True
            what = f"the {relation} dependents' tokens"
        elif target == "pronouns":
            for row, meta in enumerate(batch.meta):
                mask[row, (meta["to_word"][:, 0] > 0).nonzero().flatten()] = True
            what = "the pronouns' tokens"
        else:
            raise InputError(f"no token-loss verification for the target {target!r}")
        mask[:, 0] = False
        masks.append(mask[:, :length])
    return masks, what


def _mean_loss(losses: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[float, int]:
    total = sum(float(loss[mask].double().sum()) for loss, mask in zip(losses, masks, strict=True))
    count = sum(int(mask.sum()) for mask in masks)
    return (total / count if count else float("nan")), count


def verify(
    loaded: LoadedModel,
    report: Any,
    *,
    k: int = 3,
    draws: int = 1,
    mode: str = "zero",
    min_n: int = 20,
    seed: int = 0,
    progress: ProgressFactory | None = None,
) -> list[Verification]:
    """For every table of a scan, ablate its top-k heads and k random same-layer heads.

    Each table's role spec (``RoleSpec.verify``) says which tokens' loss to measure: previous-token,
    duplicate-token and induction the later copies of the repeated random tokens; sink the natural
    text; syntax the dependents' tokens and coreference the pronouns' tokens, over their prompt
    sets. Circuit tables are left to their own checks; descriptive tables name no role to check;
    a table whose spec defines no check gets a note in the report.
    """
    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError("--verify measures next-token loss, so it needs a causal language model")
    table = report.table
    with_role = set(
        table.loc[table.role != "", ["data", "detector", "relation", "direction"]].itertuples(
            index=False, name=None
        )
    )
    groups = []
    for s in report.sections:
        if s.n < min_n or s.data not in report.inputs:
            continue
        spec = role_spec(s.detector, s.relation)
        if spec is not None and spec.kind == "descriptive":
            continue
        target = spec.verify if spec is not None else None
        if target is None:
            name = " · ".join(part for part in (s.data, s.detector, s.relation, s.direction) if part)
            note = f"verify: no causal check is defined for {name}"
            if note not in report.notes:
                report.notes.append(note)
        elif target in TOKEN_TARGETS and (
            target in ALWAYS_CHECKED or (s.data, s.detector, s.relation, s.direction) in with_role
        ):
            groups.append((s, target))
    rng = random.Random(seed)
    advance = progress("verify", len(groups)) if progress else None
    # Choose every table's heads and controls first, so that mean ablation can take each source's
    # set-wide head means in one calibration pass.
    plans = []
    for section, target in groups:
        # The token-level roles are judged where they act: in-context copying of repeated tokens.
        source = "repeated-tokens" if target == "later-copies" else section.data
        if source not in report.inputs:
            continue
        rows = table[
            (table.data == section.data)
            & (table.detector == section.detector)
            & (table.relation == section.relation)
            & (table.direction == section.direction)
        ].sort_values("score", ascending=False)
        heads = [(int(r.layer), int(r.head)) for r in rows.head(k).itertuples()]
        controls = [random_control(heads, loaded.layout, rng) for _ in range(draws)]
        plans.append((section, target, source, rows, heads, controls))
    means: dict[str, dict[Head, torch.Tensor]] = {}
    if mode == "mean":
        for source in dict.fromkeys(plan[2] for plan in plans):
            wanted = [h for plan in plans if plan[2] == source for h in [*plan[4], *sum(plan[5], [])]]
            means[source] = capture.head_output_means(loaded, report.inputs[source], wanted)
    clean_cache: dict[str, list[torch.Tensor]] = {}
    out = []
    for section, target, source, rows, heads, controls in plans:
        batches = report.inputs[source]
        if source not in clean_cache:
            clean_cache[source] = _token_losses(loaded, batches, None)
        source_means = means.get(source)
        masks, what = _target_masks(batches, section.data, target, section.relation, report.repeat)
        clean, count = _mean_loss(clean_cache[source], masks)
        topk, _ = _mean_loss(
            _token_losses(loaded, batches, capture.AblateHeads.of(heads, mode, source_means)), masks
        )
        random_losses = [
            _mean_loss(
                _token_losses(loaded, batches, capture.AblateHeads.of(control, mode, source_means)), masks
            )[0]
            for control in controls
        ]
        out.append(
            Verification(
                section.data,
                section.detector,
                section.relation,
                section.direction,
                heads,
                float(rows.iloc[0].score),
                what,
                count,
                clean,
                topk,
                sum(random_losses) / len(random_losses),
            )
        )
        if advance:
            advance(1)
    return out
