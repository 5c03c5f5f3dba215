"""Heads defined by position alone: previous-token and attention sink (first token)."""

from __future__ import annotations

import torch

from headscope.capture import Batch
from headscope.detectors.base import Detector, RoleSpec

PREVIOUS_TOKEN_ROLE = RoleSpec(
    "prev", "previous-token", "#4dabf7", "cyan", data="natural text", verify="later-copies"
)
# The resting state (sink is muted in both reports): a head parks attention on the first token when
# its own pattern is absent, so the role rule counts sink only where no other role qualifies.
SINK_ROLE = RoleSpec(
    "sink", "attention sink (position 0)", "#e9ecef", "dim", data="natural text", verify="text"
)


class PreviousTokenDetector(Detector):
    name = "previous-token"
    summary = "attention from position i to i-1, averaged over positions whose previous token is not special"
    default_source = "text"
    role = PREVIOUS_TOKEN_ROLE

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        first, stop = max(q_start, 1), q_start + attn.shape[2]
        if first >= stop:
            return
        content = batch.content
        # Query i >= 1 with both i and i-1 real, non-special tokens (BOS/CLS/pad excluded).
        query_mask = (content[:, first:stop] & content[:, first - 1 : stop - 1]).to(attn.dtype)
        # Local row j holds query q_start + j; its previous token is key q_start + j - 1.
        to_previous = attn.diagonal(offset=q_start - 1, dim1=2, dim2=3)  # [B, H, stop - first]
        per_head = (to_previous * query_mask[:, None, :]).sum(-1)
        # Uniform attention over the keys this layer's mask leaves visible puts 1/n on i-1 (if visible).
        keys = attn.shape[3]
        visible = batch.visible(q_start, stop, keys)
        local = torch.arange(first - q_start, stop - q_start, device=attn.device)
        previous_open = visible[:, local, local + q_start - 1].to(attn.dtype)
        baseline = (query_mask * previous_open / batch.visible_count(q_start, stop, keys)[:, local]).sum(-1)
        self._accumulate(layer, batch, per_head, query_mask.sum(-1), baseline)


class SinkDetector(Detector):
    name = "sink"
    summary = "mean attention to position 0 (BOS/CLS when the tokenizer adds one), from every later position"
    default_source = "text"
    role = SINK_ROLE

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
