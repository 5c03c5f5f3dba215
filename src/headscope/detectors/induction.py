"""Heads defined by token identity: duplicate-token and induction (prefix matching)."""

from __future__ import annotations

import torch

from ..capture import Batch
from .base import Detector


def _pool(
    detector: Detector, layer: int, attn: torch.Tensor, batch: Batch, q_start: int, target: torch.Tensor
) -> None:
    """Add, per row and head, the attention mass on the (sparse) target keys of every query.

    Targets are few per query, so the mass is gathered at their coordinates instead of
    multiplying the whole [B, H, T, T] map by a dense mask: this keeps the cost of these
    detectors far below the cost of computing the attention itself at long context.
    """
    stop = q_start + attn.shape[2]
    key = f"sparse:{id(target)}:{q_start}:{stop}"
    if key not in batch._cache:
        chunk = target[:, q_start:stop]  # targets are earlier keys, so they lie inside the chunk's K'
        rows, queries, keys = chunk.nonzero(as_tuple=True)
        query_mask = chunk.any(-1)
        batch._cache[key] = (rows, queries, keys, query_mask.sum(-1))
    rows, queries, keys, counts = batch._cache[key]
    mass = attn[rows, :, queries, keys]  # [nnz, H]
    per_head = torch.zeros(attn.shape[0], attn.shape[1], dtype=attn.dtype, device=attn.device)
    per_head.index_add_(0, rows, mass)
    # Uniform attention puts 1/n on each target the layer's mask leaves visible (a sliding window
    # can hide an earlier occurrence), n = the visible keys of that query. Per layer: masks differ.
    n_keys = attn.shape[3]
    visible = batch.visible(q_start, stop, n_keys)
    share = (
        visible[rows, queries, keys].to(attn.dtype)
        / batch.visible_count(q_start, stop, n_keys)[rows, queries]
    )
    baseline = torch.zeros(attn.shape[0], dtype=attn.dtype, device=attn.device).index_add_(0, rows, share)
    detector._accumulate(layer, batch, per_head, counts, baseline)


def induction_targets(batch: Batch) -> torch.Tensor:
    """[B, Q, K] True at k = j+1 for every earlier occurrence j of query q's token, with k < q.

    This is prefix matching: in "A B ... A", the second A should look at B.
    """
    if "induction_targets" not in batch._cache:
        earlier = batch.earlier_same_token
        target = torch.zeros_like(earlier)
        target[:, :, 1:] = earlier[:, :, :-1]
        length = target.shape[-1]
        strictly_earlier = torch.ones(length, length, dtype=torch.bool, device=target.device).tril(-1)
        target &= strictly_earlier & batch.content[:, None, :]
        batch._cache["induction_targets"] = target
    return batch._cache["induction_targets"]


class DuplicateTokenDetector(Detector):
    name = "duplicate-token"
    summary = "attention from a token to its earlier occurrences, summed, over tokens seen before"
    default_source = "repeated-tokens"

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        _pool(self, layer, attn, batch, q_start, batch.earlier_same_token)


class InductionDetector(Detector):
    name = "induction"
    summary = "attention from a repeated token to the tokens that followed its earlier occurrences"
    default_source = "repeated-tokens"

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        _pool(self, layer, attn, batch, q_start, induction_targets(batch))
