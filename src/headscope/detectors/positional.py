"""Heads defined by position alone: previous-token and attention sink (first token)."""

from __future__ import annotations

import torch

from headscope.capture import Batch
from headscope.capture.rows import Pairs, PairWeights
from headscope.detectors.base import Detector, RoleSpec
from headscope.detectors.target import TargetDetector, Targets

PREVIOUS_TOKEN_ROLE = RoleSpec(
    "prev", "previous-token", "#4dabf7", "cyan", data="natural text", verify="later-copies"
)
# The resting state (sink is muted in both reports): a head parks attention on the first token when
# its own pattern is absent, so the role rule counts sink only where no other role qualifies.
SINK_ROLE = RoleSpec(
    "sink", "attention sink (position 0)", "#e9ecef", "dim", data="natural text", verify="text"
)


def previous_token_targets(batch: Batch) -> Targets:
    """(rows, queries, keys) with k = q - 1, for queries q >= 1 where both q and q - 1 hold real,
    non-special tokens (BOS/CLS/pad excluded)."""
    content = batch.content
    rows, previous = (content[:, 1:] & content[:, :-1]).nonzero(as_tuple=True)
    return rows, previous + 1, previous


PreviousTokenDetector = TargetDetector(
    "previous-token",
    targets=previous_token_targets,
    summary="attention from position i to i-1, averaged over positions whose previous token is not special",
    source="text",
    role=PREVIOUS_TOKEN_ROLE,
)


class SinkDetector(Detector):
    name = "sink"
    summary = "mean attention to position 0 (BOS/CLS when the tokenizer adds one), from every later position"
    default_source = "text"
    role = SINK_ROLE

    def reads(self, batch: Batch) -> Pairs:
        """Key 0 from every real query after it: the only weights the score reads."""
        key = "sink-pairs"
        if key not in batch._cache:
            mask = batch.attention_mask.clone()
            mask[:, 0] = False
            rows, queries = mask.nonzero(as_tuple=True)
            batch._cache[key] = Pairs.of(rows, queries, torch.zeros_like(queries))  # type: ignore[assignment]
        return batch._cache[key]  # type: ignore[return-value]

    def update_pairs(self, layer: int, found: PairWeights, batch: Batch) -> None:
        ((rows, _, _),) = self.reads(batch).parts
        weights = found.weights
        n = batch.input_ids.shape[0]
        per_head = torch.zeros(n, weights.shape[1], dtype=weights.dtype, device=weights.device)
        per_head.index_add_(0, rows, weights)
        counts = torch.zeros(n, dtype=weights.dtype, device=weights.device)
        counts.index_add_(0, rows, torch.ones_like(found.keys_seen, dtype=weights.dtype))
        share = found.visible.to(weights.dtype) / found.keys_seen.to(weights.dtype)
        baseline = torch.zeros(n, dtype=weights.dtype, device=weights.device).index_add_(0, rows, share)
        self._accumulate(layer, batch, per_head, counts, baseline)

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        stop = q_start + attn.shape[2]
        query_mask = batch.attention_mask[:, q_start:stop].clone()
        if q_start == 0:
            query_mask[:, 0] = False  # position 0 attending to itself says nothing in a causal model
        query_mask = query_mask.to(attn.dtype)
        per_head = (attn[..., 0] * query_mask[:, None, :]).sum(-1)
        keys = attn.shape[3]
        first_open = batch.visible(q_start, stop, keys)[..., 0].to(attn.dtype)  # outside a window: 0
        baseline = (query_mask * first_open / batch.visible_count(q_start, stop, keys)).sum(-1)
        self._accumulate(layer, batch, per_head, query_mask.sum(-1), baseline)
