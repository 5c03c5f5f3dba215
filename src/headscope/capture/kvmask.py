"""Streaming KV heads: a per-KV-head mask that keeps only an attention sink and a recent window.

DuoAttention (Xiao et al., ICLR 2025) serves "streaming" heads from a constant-size cache: the
first ``sink`` tokens and the last ``recent`` ones. Its mask (``generate_streaming_mask`` in
mit-han-lab/duo-attention) lets query q see key k when k <= q and (k < sink or q - k < recent).
:class:`StreamHeads` (an edit, :mod:`headscope.capture.edits`) applies exactly that mask to every query head that reads a chosen KV head,
inside headscope's own attention function (:func:`headscope.capture.stream.streaming_attention`);
every other head keeps the model's own mask. Positions count real tokens only, so a padded row is
masked as it would be alone. The cache is not compressed: the result is what the compressed cache
would compute, and the memory it would save is computed separately.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .batch import Batch


@dataclass(frozen=True)
class StreamHeads:
    """KV heads that see only the first ``sink`` and the last ``recent`` keys (the query included)."""

    kv_heads: dict[int, tuple[int, ...]]  # layer -> KV heads
    sink: int
    recent: int

    def __post_init__(self) -> None:
        if self.sink < 0 or self.recent < 1:
            raise ValueError(
                f"streaming heads need sink >= 0 and recent >= 1, got {self.sink}, {self.recent}"
            )

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]], sink: int, recent: int) -> StreamHeads:
        """From (layer, KV head) pairs."""
        heads: dict[int, set[int]] = {}
        for layer, kv in pairs:
            heads.setdefault(int(layer), set()).add(int(kv))
        return cls({layer: tuple(sorted(kvs)) for layer, kvs in sorted(heads.items())}, sink, recent)

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return [(layer, kv) for layer, kvs in self.kv_heads.items() for kv in kvs]

    def blocked(
        self,
        layer: int,
        batch: Batch,
        n_heads: int,
        n_kv_heads: int,
        q_start: int,
        stop: int,
        first: int,
        limit: int,
    ) -> torch.Tensor | None:
        """[B, H, c, K'] True where a streaming head may not attend (queries q_start..stop-1, keys
        first..limit-1); None when this layer has no streaming head."""
        kvs = self.kv_heads.get(layer)
        if not kvs:
            return None
        device = batch.input_ids.device
        positions = batch.positions()  # [B, T]: index among the row's real tokens
        pos_q = positions[:, q_start:stop, None]
        pos_k = positions[:, None, first:limit]
        far = (pos_k >= self.sink) & (pos_q - pos_k >= self.recent)  # [B, c, K']
        group = n_heads // n_kv_heads
        reads = torch.zeros(n_heads, dtype=torch.bool, device=device)
        for kv in kvs:
            reads[kv * group : (kv + 1) * group] = True
        return far[:, None] & reads[None, :, None, None]


# The name kv-plan has always used.
StreamingHeads = StreamHeads
