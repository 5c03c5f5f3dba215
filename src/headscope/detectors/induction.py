"""Heads defined by token identity: duplicate-token and induction (prefix matching)."""

from __future__ import annotations

import torch

from headscope.capture import Batch
from headscope.detectors.base import Detector, RoleSpec

Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (rows, queries, keys), sparse


def _pool(
    detector: Detector, layer: int, attn: torch.Tensor, batch: Batch, q_start: int, targets: Pairs
) -> None:
    """Add, per row and head, the attention mass on the (sparse) target keys of every query.

    Targets are few per query and kept as coordinates, so the mass is gathered at them instead
    of multiplying the whole [B, H, T, T] map by a dense mask, and no T x T structure is built.
    """
    stop = q_start + attn.shape[2]
    key = f"sparse:{id(targets)}:{q_start}:{stop}"
    if key not in batch._cache:
        all_rows, all_queries, all_keys = targets
        inside = (all_queries >= q_start) & (all_queries < stop)
        rows, queries, keys = all_rows[inside], all_queries[inside] - q_start, all_keys[inside]
        # Queries with at least one target, per row: the positions this detector counts.
        first_of_query = torch.ones_like(rows, dtype=torch.bool)
        if len(rows) > 1:
            first_of_query[1:] = (rows[1:] != rows[:-1]) | (queries[1:] != queries[:-1])
        counts = torch.zeros(attn.shape[0], dtype=torch.long, device=attn.device)
        counts.index_add_(0, rows, first_of_query.long())
        batch._cache[key] = (rows, queries, keys, counts)
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


def induction_targets(batch: Batch) -> Pairs:
    """(rows, queries, keys) with k = j+1 for every earlier occurrence j of query q's token, k < q.

    This is prefix matching: in "A B ... A", the second A should look at B.
    """
    if "induction_targets" not in batch._cache:
        rows, queries, earlier = batch.earlier_same_token_pairs
        keys = earlier + 1
        keep = keys < queries
        rows, queries, keys = rows[keep], queries[keep], keys[keep]
        keep = batch.content[rows, keys]
        batch._cache["induction_targets"] = (rows[keep], queries[keep], keys[keep])
    return batch._cache["induction_targets"]  # type: ignore[return-value]


class DuplicateTokenDetector(Detector):
    name = "duplicate-token"
    summary = "attention from a token to its earlier occurrences, summed, over tokens seen before"
    default_source = "repeated-tokens"
    role = RoleSpec(
        "dup", "duplicate-token", "#da77f2", "magenta", data="repeated random tokens", verify="later-copies"
    )

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        _pool(self, layer, attn, batch, q_start, batch.earlier_same_token_pairs)


class InductionDetector(Detector):
    name = "induction"
    summary = "attention from a repeated token to the tokens that followed its earlier occurrences"
    default_source = "repeated-tokens"
    role = RoleSpec(
        "ind", "induction", "#f03e3e", "bold red", data="repeated random tokens", verify="later-copies"
    )

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        _pool(self, layer, attn, batch, q_start, induction_targets(batch))
