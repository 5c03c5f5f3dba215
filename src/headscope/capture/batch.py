"""Padded batches of token rows, and what detectors need to know about each row (masks, visibility, repeats)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def mask_open(mask: torch.Tensor) -> torch.Tensor:
    """Where a layer's mask lets a query attend: True in a boolean mask, or an additive bias
    above half the dtype's minimum (masked entries hold the minimum, kept ones 0)."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


@dataclass
class Batch:
    """Padded token ids plus what detectors need to know about each row.

    ``special`` marks BOS/CLS/SEP and other special tokens; ``attention_mask`` marks real
    (non-pad) positions. ``example_index`` maps each row to its example in the prompt set,
    so that scores can be kept per example and bootstrapped.
    """

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] bool
    special: torch.Tensor  # [B, T] bool
    example_index: torch.Tensor  # [B] long
    is_causal: bool
    meta: list[dict[str, Any]] = field(default_factory=list)
    # The model's tokenizer, for detectors whose targets depend on what a token is (a bracket, a
    # verb); None where the batch was built without one (synthetic tests).
    tokenizer: Any = field(default=None, repr=False, compare=False)
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _chunk: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def content(self) -> torch.Tensor:
        """Positions holding a real, non-special token."""
        return self.attention_mask & ~self.special

    def positions(self) -> torch.Tensor:
        """[B, T] each position's index among its row's real tokens (padding does not count)."""
        cached = self._cache.get("positions")
        if cached is None:
            cached = self.attention_mask.long().cumsum(1) - 1
            self._cache["positions"] = cached
        return cached

    def set_chunk(
        self,
        q_start: int,
        stop: int,
        mask: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> None:
        """Record which keys the current layer's mask leaves visible to queries ``q_start..stop-1``.

        The capture calls this before handing a chunk to the detectors: with the chunk of the
        layer's own mask (``mask``, additive or boolean, ``[B, 1 or H, c, K']``), or, where the
        mask is not available (eager capture), with ``visible`` ``[B, c, K']`` read off the weights.
        """
        self._chunk = {"q_start": q_start, "stop": stop, "mask": mask, "visible": visible}

    def visible(self, q_start: int, stop: int, keys: int) -> torch.Tensor:
        """[B, c, keys] True where the current layer's mask lets query q see key k.

        Read from the layer's own mask when the capture recorded it for this chunk, so a
        sliding-window layer past its window, or any other mask, gives the keys it really leaves
        visible. Without a recorded mask (synthetic maps fed to a detector), the keys are the
        real (non-pad) tokens, and in a causal model only those up to the query.
        """
        chunk = self._chunk
        if chunk is not None and chunk["q_start"] == q_start and chunk["stop"] == stop:
            if chunk["visible"] is None:
                mask = chunk["mask"]
                if mask is None:
                    seen = self.attention_mask[:, None, :].expand(-1, stop - q_start, -1)
                else:
                    open_ = mask_open(mask)
                    seen = open_.any(1) if open_.shape[1] > 1 else open_[:, 0]
                    seen = seen.expand(self.input_ids.shape[0], stop - q_start, -1)
                chunk["visible"] = seen
            return chunk["visible"][..., :keys]
        seen = self.attention_mask[:, None, :keys].expand(-1, stop - q_start, -1)
        if self.is_causal:
            queries = torch.arange(q_start, stop, device=seen.device)[:, None]
            seen = seen & (torch.arange(keys, device=seen.device)[None, :] <= queries)
        return seen

    def visible_count(self, q_start: int, stop: int, keys: int) -> torch.Tensor:
        """[B, c] how many keys each query may attend to (what uniform attention spreads over)."""
        return self.visible(q_start, stop, keys).sum(-1).to(torch.float32).clamp(min=1.0)

    @property
    def earlier_same_token_pairs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, queries, keys): every key k < query q holding the same content token as q.

        Kept sparse, as coordinates: a [B, T, T] map would be 1 GB per row at 32k tokens, while
        the pairs number about T x (repeats - 1) on the repeated-token protocol.
        """
        if "earlier_same_token_pairs" not in self._cache:
            rows, queries, keys = [], [], []
            content = self.content.cpu()
            ids = self.input_ids.cpu()
            for row in range(ids.shape[0]):
                positions = content[row].nonzero().flatten()
                tokens = ids[row, positions]
                order = torch.sort(tokens, stable=True).indices  # same token: ascending position
                ordered_pos, ordered_tok = positions[order], tokens[order]
                starts = torch.ones_like(ordered_tok, dtype=torch.bool)
                starts[1:] = ordered_tok[1:] != ordered_tok[:-1]
                bounds = [*starts.nonzero().flatten().tolist(), len(ordered_tok)]
                for first, last in zip(bounds[:-1], bounds[1:], strict=True):
                    if last - first < 2:
                        continue
                    group = ordered_pos[first:last]
                    later, earlier = torch.tril_indices(len(group), len(group), offset=-1)
                    rows.append(torch.full((len(later),), row, dtype=torch.long))
                    queries.append(group[later])
                    keys.append(group[earlier])
            device = self.input_ids.device
            empty = torch.zeros(0, dtype=torch.long)
            self._cache["earlier_same_token_pairs"] = tuple(
                (torch.cat(part) if part else empty).to(device) for part in (rows, queries, keys)
            )
        return self._cache["earlier_same_token_pairs"]  # type: ignore[return-value]

    @property
    def earlier_same_token(self) -> torch.Tensor:
        """[B, Q, K] dense form of :attr:`earlier_same_token_pairs` (for tests and short inputs)."""
        rows, queries, keys = self.earlier_same_token_pairs
        length = self.input_ids.shape[1]
        dense = torch.zeros(self.input_ids.shape[0], length, length, dtype=torch.bool, device=rows.device)
        dense[rows, queries, keys] = True
        return dense

    def tokens(self, row: int) -> list[str]:
        """The token strings of ``row``'s real positions, as the tokenizer spells them
        (``convert_ids_to_tokens``: "Ġ(" in byte-level BPE, "▁(" in SentencePiece)."""
        if self.tokenizer is None:
            raise ValueError("this batch was built without a tokenizer")
        key = f"tokens:{row}"
        if key not in self._cache:
            ids = self.input_ids[row, self.attention_mask[row]].tolist()
            self._cache[key] = self.tokenizer.convert_ids_to_tokens(ids)  # type: ignore[assignment]
        return self._cache[key]  # type: ignore[return-value]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.special.to(device),
            self.example_index,
            self.is_causal,
            self.meta,
            self.tokenizer,
        )


def make_batches(
    sequences: Sequence[Sequence[int]],
    special_masks: Sequence[Sequence[bool]],
    *,
    batch_size: int,
    pad_id: int,
    is_causal: bool,
    meta: Sequence[dict[str, Any]] | None = None,
    sort_by_length: bool = True,
    tokenizer: Any = None,
) -> list[Batch]:
    """Right-pad sequences into batches. Sorting by length keeps padding (wasted work) small."""
    order = list(range(len(sequences)))
    if sort_by_length:
        order.sort(key=lambda i: len(sequences[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        special = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, i in enumerate(rows):
            n = len(sequences[i])
            ids[r, :n] = torch.as_tensor(list(sequences[i]), dtype=torch.long)
            mask[r, :n] = True
            special[r, :n] = torch.as_tensor(list(special_masks[i]), dtype=torch.bool)
        batches.append(
            Batch(
                ids,
                mask,
                special,
                torch.as_tensor(rows, dtype=torch.long),
                is_causal,
                [dict(meta[i]) for i in rows] if meta is not None else [{} for _ in rows],
                tokenizer,
            )
        )
    return batches
