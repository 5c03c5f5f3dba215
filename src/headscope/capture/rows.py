"""Which query rows of each layer's attention someone reads, and the spans that get exact weights.

A reader (a detector, an analysis' callback) declares its rows with ``reads(batch)``: ``None`` for
every row, a ``[B, T]`` boolean mask of the rows it reads (the last token, the answer positions,
any mask), or :class:`Pairs`, the (row, query, key) coordinates it reads (a target detector reads
a few keys of each query). The streaming capture computes exact float32 weights for the union of
the readers' rows over the batch, hands those on, and sends every other row through the fused
SDPA kernel with the same mask: the weights of those rows are never computed. When every reader
reads pairs, no row is computed at all: the fused kernel also returns each row's log-sum-exp, and
the weight of a pair is ``exp(q·k × scale − lse)`` (:class:`PairWeights`). :func:`full_maps` turns
this off (every row exact), for the checks that the paths agree; :func:`counting` counts the rows
of each path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from .batch import Batch


@dataclass(frozen=True)
class Pairs:
    """The coordinates some readers read: ``parts[i] = (rows, queries, keys)`` for reader ``i``."""

    parts: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]

    @classmethod
    def of(cls, rows: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> Pairs:
        return cls(((rows, queries, keys),))

    def query_mask(self, batch: Batch) -> torch.Tensor:
        """[B, T] the query rows the pairs fall in."""
        mask = torch.zeros_like(batch.attention_mask)
        for rows, queries, _ in self.parts:
            mask[rows.to(mask.device), queries.to(mask.device)] = True
        return mask


@dataclass
class PairWeights:
    """One reader's pairs in one layer: ``weights[n, H]`` (float32, each a query's softmax weight
    on that key), ``visible[n]`` (the layer's mask lets the query see the key) and ``keys_seen[n]``
    (how many keys the mask lets that query see, at least 1: what uniform attention spreads over)."""

    weights: torch.Tensor
    visible: torch.Tensor
    keys_seen: torch.Tensor


# reads(batch) -> [B, T] bool (the rows read), Pairs (the coordinates read) or None (every row).
Reads = Callable[[Batch], "torch.Tensor | Pairs | None"]

_FULL_MAPS: ContextVar[bool] = ContextVar("headscope_full_maps", default=False)
_COUNTER: ContextVar[RowCounts | None] = ContextVar("headscope_row_counts", default=None)


def every_row(batch: Batch) -> None:
    """Every query row is read (the token-level detectors)."""
    return None


def no_row(batch: Batch) -> torch.Tensor:
    """No row is read: passes run for their losses, hidden states or head outputs only."""
    return torch.zeros_like(batch.attention_mask)


def last_row(batch: Batch) -> torch.Tensor:
    """Each row's last real token."""
    mask = torch.zeros_like(batch.attention_mask)
    last = batch.attention_mask.long().sum(1) - 1
    mask[torch.arange(mask.shape[0], device=mask.device), last.clamp(min=0)] = True
    return mask


def at_positions(batch: Batch, positions: Sequence[Sequence[int]]) -> torch.Tensor:
    """``positions[r]``: the query positions row ``r`` reads."""
    mask = torch.zeros_like(batch.attention_mask)
    for row, wanted in enumerate(positions):
        if len(wanted):
            mask[row, torch.as_tensor(list(wanted), dtype=torch.long, device=mask.device)] = True
    return mask


def union(readers: Sequence[Reads]) -> Reads:
    """What ``readers`` read together: every row as soon as one reads every row; their pairs, one
    part per reader in order, when every one reads pairs; else the rows any of them reads."""

    def reads(batch: Batch) -> torch.Tensor | Pairs | None:
        found = []
        for reader in readers:
            got = reader(batch)
            if got is None:
                return None
            found.append(got)
        if found and all(isinstance(f, Pairs) for f in found):
            return Pairs(tuple(part for f in found for part in f.parts))  # type: ignore[union-attr]
        total = no_row(batch)
        for got in found:
            total = total | (got.query_mask(batch) if isinstance(got, Pairs) else got)
        return total

    return reads


def spans(mask: torch.Tensor) -> list[tuple[int, int]]:
    """The runs of query positions that any row of ``[B, T]`` reads, as (start, stop) pairs."""
    read = mask.any(0).cpu()
    if not bool(read.any()):
        return []
    edges = torch.diff(
        read.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8)
    )
    starts = (edges == 1).nonzero().flatten().tolist()
    stops = (edges == -1).nonzero().flatten().tolist()
    return list(zip(starts, stops, strict=True))


def complement(read: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The spans of 0..length-1 not in ``read`` (sorted, disjoint)."""
    out, at = [], 0
    for start, stop in read:
        if start > at:
            out.append((at, start))
        at = max(at, stop)
    if at < length:
        out.append((at, length))
    return out


@contextlib.contextmanager
def full_maps() -> Iterator[None]:
    """Compute exact weights for every query row, whatever the readers declare (the reference
    path that the selective one is checked against)."""
    token = _FULL_MAPS.set(True)
    try:
        yield
    finally:
        _FULL_MAPS.reset(token)


def selective() -> bool:
    return not _FULL_MAPS.get()


@dataclass
class RowCounts:
    """Query rows (summed over layers and calls) that got exact weights, and that ran fused."""

    exact_rows: dict[int, int] = field(default_factory=dict)
    fused_rows: dict[int, int] = field(default_factory=dict)
    pairs: dict[int, int] = field(default_factory=dict)  # (row, query, key) weights from the LSE

    def exact(self, layer: int, n: int) -> None:
        self.exact_rows[layer] = self.exact_rows.get(layer, 0) + n

    def fused(self, layer: int, n: int) -> None:
        self.fused_rows[layer] = self.fused_rows.get(layer, 0) + n

    def paired(self, layer: int, n: int) -> None:
        self.pairs[layer] = self.pairs.get(layer, 0) + n

    @property
    def total_exact(self) -> int:
        return sum(self.exact_rows.values())

    @property
    def total_fused(self) -> int:
        return sum(self.fused_rows.values())

    @property
    def total_pairs(self) -> int:
        return sum(self.pairs.values())


class _NoCounts(RowCounts):
    def exact(self, layer: int, n: int) -> None:
        return None

    def fused(self, layer: int, n: int) -> None:
        return None

    def paired(self, layer: int, n: int) -> None:
        return None


NO_COUNTS = _NoCounts()


@contextlib.contextmanager
def counting() -> Iterator[RowCounts]:
    """Count, per layer, the query rows computed each way during the block."""
    counts = RowCounts()
    token = _COUNTER.set(counts)
    try:
        yield counts
    finally:
        _COUNTER.reset(token)


def active_counts() -> RowCounts:
    counts = _COUNTER.get()
    return counts if counts is not None else NO_COUNTS
