"""Heads defined by token identity: duplicate-token and induction (prefix matching)."""

from __future__ import annotations

import torch

from ..capture import Batch
from .base import Detector


def _masked_mass(attn: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[B, H, Q]: attention each query gives to its target keys (target is [B, Q, K] bool)."""
    return torch.einsum("bhqk,bqk->bhq", attn, target.to(attn.dtype))


def _pool(detector: Detector, layer: int, attn: torch.Tensor, batch: Batch, target: torch.Tensor) -> None:
    query_mask = target.any(-1).to(attn.dtype)  # queries that have at least one target
    per_head = (_masked_mass(attn, target) * query_mask[:, None, :]).sum(-1)
    baseline = (target.sum(-1).to(attn.dtype) / batch.n_visible).sum(-1)
    detector._accumulate(layer, batch, per_head, query_mask.sum(-1), baseline)


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

    def update(self, layer: int, attn: torch.Tensor, batch: Batch) -> None:
        _pool(self, layer, attn, batch, batch.earlier_same_token)


class InductionDetector(Detector):
    name = "induction"
    summary = "attention from a repeated token to the tokens that followed its earlier occurrences"
    default_source = "repeated-tokens"

    def update(self, layer: int, attn: torch.Tensor, batch: Batch) -> None:
        _pool(self, layer, attn, batch, induction_targets(batch))
