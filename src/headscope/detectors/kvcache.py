"""Long-range attention mass: what a head would lose if it kept only a sink and a recent window.

Not a head role of its own (it is not in the scan's registry): ``headscope kv-plan`` scores KV
heads with it. For a query at position q (counting real tokens) past the window (q >= sink +
recent), the long-range mass is the share of its attention on keys k >= sink with q - k >= recent:
exactly the keys a streaming head's mask (:mod:`headscope.capture.kvmask`) removes. The reference
is uniform attention over the keys the layer's mask leaves visible.
"""

from __future__ import annotations

import torch

from headscope.capture import Batch
from headscope.detectors.base import Detector


class LongRangeDetector(Detector):
    name = "long-range"
    summary = (
        "share of attention outside the first `sink` and the last `recent` keys, at queries past that window"
    )
    default_source = "text"
    part = "score"  # kv-plan scores it; never a scan's detector

    def __init__(self, sink: int, recent: int) -> None:
        self.sink = sink
        self.recent = recent

    def reads(self, batch: Batch) -> torch.Tensor:
        """The queries past the sink and recent window: the only ones whose mass is counted."""
        return batch.attention_mask & (batch.positions() >= self.sink + self.recent)

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        stop = q_start + attn.shape[2]
        keys = attn.shape[3]
        positions = batch.positions()
        pos_q = positions[:, q_start:stop]  # [B, c]
        pos_k = positions[:, :keys]  # [B, K']
        query_mask = batch.attention_mask[:, q_start:stop] & (pos_q >= self.sink + self.recent)
        far = (
            (pos_k[:, None, :] >= self.sink)
            & (pos_q[:, :, None] - pos_k[:, None, :] >= self.recent)
            & batch.attention_mask[:, None, :keys]
        )  # [B, c, K']
        weights = query_mask.to(attn.dtype)
        per_head = ((attn * far[:, None].to(attn.dtype)).sum(-1) * weights[:, None, :]).sum(-1)  # [B, H]
        visible = batch.visible(q_start, stop, keys)
        share = (far & visible).sum(-1).to(attn.dtype) / visible.sum(-1).clamp(min=1).to(attn.dtype)
        self._accumulate(layer, batch, per_head, weights.sum(-1), (share * weights).sum(-1))
