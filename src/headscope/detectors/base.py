"""The detector contract.

A detector turns one layer's attention ``[batch, head, query, key]`` plus the batch's metadata
into running per-example sums, one per head. The attention arrives in query chunks (see
``update``), so no detector ever needs a layer's whole map. It never modifies the attention tensor and never
does I/O. Keeping sums per example (sequence, sentence or pair) lets ``stats`` bootstrap over
examples later.

For each (relation, direction) a detector reports, per example ``e`` and head ``(l, h)``:

* ``sums[e, l, h]``: the summed per-query quantity (attention mass, or 1 for a correct argmax),
* ``counts[e]``: how many queries (positions, pairs) example ``e`` contributed,
* ``baseline_sums[e, l]`` (or ``[e]`` when it cannot depend on the layer): the same sum for the
  detector's "no role" reference. The uniform-attention reference is per layer, because it
  counts the keys that each layer's mask leaves visible (a sliding-window layer past its window
  sees fewer keys than a global one).

score = sums.sum(0) / counts.sum() and baseline = baseline_sums.sum(0) / counts.sum().
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from headscope.capture import Batch
from headscope.capture.rows import Pairs, PairWeights
from headscope.core.rolespec import RoleSpec
from headscope.models import HeadLayout

Need = Literal["tokens", "words", "arcs", "coref", "logits", "positions"]
Source = Literal["text", "repeated-tokens", "treebank", "coref", "ioi", "retrieval"]
# The part a declaration plays: run by a scan on its data; a score's tables, which an analysis
# computes itself (kv-plan's long-range mass, icl's function vectors), described like a role but
# never run in a scan; hs.detect's pattern, scored on the prompts it was made for.
Part = Literal["scan", "score", "pattern"]


@dataclass
class DetectorResult:
    """Per-example sums for one (detector, relation, direction)."""

    detector: str
    relation: str
    direction: str
    sums: torch.Tensor  # [E, L, H] float64
    counts: torch.Tensor  # [E] float64
    baseline_sums: torch.Tensor  # [E] or [E, L] float64
    baseline_kind: str
    data: str = ""
    baseline_label: str = ""  # e.g. "offset -1" or "first word" for the syntax baseline
    extras: dict[str, float] = field(default_factory=dict)  # e.g. {"chance": 0.5}
    # False for a value computed once over all its data (no resampling unit): no interval, no note.
    interval: bool = True

    @property
    def n(self) -> int:
        return int(self.counts.sum().item())

    @property
    def n_examples(self) -> int:
        return int((self.counts > 0).sum().item())

    def scores(self) -> torch.Tensor:
        """[L, H] pooled score (0 where nothing was counted)."""
        total = self.counts.sum()
        if total == 0:
            return torch.zeros(self.sums.shape[1:], dtype=torch.float64)
        return self.sums.sum(0) / total

    def baseline_by_layer(self) -> torch.Tensor | None:
        """[L] the reference score of each layer (None when nothing was counted)."""
        total = self.counts.sum()
        if total == 0:
            return None
        per_layer = self.baseline_sums.sum(0) / total
        n_layers = self.sums.shape[1]
        return per_layer.expand(n_layers).clone() if per_layer.dim() == 0 else per_layer

    def baseline(self) -> float | None:
        """The reference score; where layers differ (masks of different reach), their mean."""
        by_layer = self.baseline_by_layer()
        return None if by_layer is None else float(by_layer.mean())

    def baseline_range(self) -> tuple[float, float] | None:
        by_layer = self.baseline_by_layer()
        return None if by_layer is None else (float(by_layer.min()), float(by_layer.max()))


class Detector(ABC):
    """One head role. Subclasses set the class attributes and implement ``update``.

    The role's facts (label, meaning, colour, style, data, verification target) are declared here,
    with the detector: ``role`` is the spec of every table the detector reports; ``roles`` gives
    one per relation where relations name different roles (syntax, IOI). Registering the class in
    ``headscope.detectors.REGISTRY`` is all the role map, the legends and ``--verify`` need.
    ``part`` says what it is there for (:data:`Part`): a scan's detector unless it says otherwise.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    part: ClassVar[Part] = "scan"
    needs: ClassVar[frozenset[Need]] = frozenset({"tokens"})
    default_source: ClassVar[Source] = "text"
    baseline_kind: ClassVar[str] = "uniform"
    role: ClassVar[RoleSpec | None] = None
    roles: ClassVar[Mapping[str, RoleSpec]] = {}
    # How the reports print its tables (headscope.outputs reads these and names no detector). Format
    # strings over a table's fields: {detector}, {data}, {relation}, {direction}, {relation_name},
    # {description}, {n}, {n_examples}, {baseline} and {extras[NAME]} (numbers as the tables print
    # them). ``heading``: a table's heading (None: "detector · relation · direction");
    # ``caption``: the line under it (None: the data, n, baseline and interval); ``short_name``: its
    # name in ``headscope compare`` (None: the detector's). ``grouped``: the tables of one data set
    # print as one table, a row per relation, with ``relation_names`` (what each means) as legend.
    heading: ClassVar[str | None] = None
    caption: ClassVar[str | None] = None
    short_name: ClassVar[str | None] = None
    grouped: ClassVar[bool] = False
    relation_names: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def role_spec(cls, relation: str) -> RoleSpec | None:
        """The spec of this detector's table for ``relation`` (None: the detector declares none)."""
        return cls.roles.get(relation, cls.role)

    @classmethod
    def role_specs(cls) -> list[RoleSpec]:
        """Every spec the detector declares (the lookup by label reads these)."""
        return [spec for spec in (cls.role, *cls.roles.values()) if spec is not None]

    def start(self, layout: HeadLayout, n_examples: int) -> None:
        self.layout = layout
        self.n_examples = n_examples
        shape = (n_examples, layout.n_layers, layout.n_heads)
        self._sums = torch.zeros(shape, dtype=torch.float64)
        self._counts = torch.zeros(n_examples, dtype=torch.float64)
        self._baseline = torch.zeros(n_examples, layout.n_layers, dtype=torch.float64)
        self._counted_layer: int | None = None

    def _accumulate(
        self,
        layer: int,
        batch: Batch,
        per_row_head: torch.Tensor,
        counts: torch.Tensor,
        baseline: torch.Tensor,
    ) -> None:
        """Add ``per_row_head[B, H]`` and ``baseline[B]`` to layer ``layer``; counts once per batch.

        The sums live on the attention's device while the pass runs (no copy to the host, and so
        no wait for the device, per chunk); :meth:`_on_host` brings them back for the results."""
        device = per_row_head.device
        if self._sums.device != device:
            self._sums, self._baseline, self._counts = (
                t.to(device) for t in (self._sums, self._baseline, self._counts)
            )
        key = f"example_index:{device}"
        if key not in batch._cache:
            batch._cache[key] = batch.example_index.to(device)
        rows = batch._cache[key]
        self._sums[rows, layer] += per_row_head.double()
        self._baseline[rows, layer] += baseline.double()
        # Counts do not depend on the layer; add them on the first layer seen.
        if self._counted_layer is None:
            self._counted_layer = layer
        if layer == self._counted_layer:
            self._counts[rows] += counts.double()

    def _on_host(self) -> None:
        """The running sums back on the CPU (where results and statistics read them)."""
        if self._sums.device.type != "cpu":
            self._sums, self._baseline, self._counts = (
                t.cpu() for t in (self._sums, self._baseline, self._counts)
            )

    @abstractmethod
    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        """Consume one query chunk of a layer's attention. Read-only.

        ``attn`` is float32 ``[B, H, c, K']``: the rows of queries ``q_start .. q_start + c - 1``
        (each sums to 1). ``K'`` can be smaller than the batch length when the keys after the
        chunk are masked; those weights are 0. Chunks of one layer arrive in order, then
        ``end_layer`` is called.
        """

    def reads(self, batch: Batch) -> torch.Tensor | Pairs | None:
        """The query rows ``update`` reads in ``batch``: a ``[B, T]`` boolean mask, or None for
        every row. Only these rows get exact weights and reach ``update`` (in chunks of
        consecutive rows; other chunks never arrive); the rest of the layer runs through the fused
        SDPA kernel (:mod:`headscope.capture.rows`). Declare as few as the detector needs. A
        detector that reads a few keys of each query may return
        :class:`~headscope.capture.rows.Pairs` and implement :meth:`update_pairs`: when every
        detector of a pass does, no row's weights are computed at all."""
        return None

    def update_pairs(self, layer: int, found: PairWeights, batch: Batch) -> None:
        """The weights at the pairs ``reads`` declared (a :class:`~headscope.capture.rows.Pairs`),
        in one call per layer, instead of ``update``'s chunks: only for detectors whose ``reads``
        returns pairs. Then ``end_layer`` is called as usual."""
        raise NotImplementedError(f"{self.name}: reads() returned pairs, but update_pairs is missing")

    def end_layer(self, layer: int, batch: Batch) -> None:
        """Called after the last chunk of ``layer``. Detectors that need whole rows finish here."""
        return None

    def consume(self, layer: int, attn: torch.Tensor, batch: Batch) -> None:
        """Feed a whole layer's map ``[B, H, T, T]`` at once."""
        self.update(layer, attn, batch, 0)
        self.end_layer(layer, batch)

    def results(self, data: str = "") -> list[DetectorResult]:
        self._on_host()
        return [
            DetectorResult(
                self.name, "", "", self._sums, self._counts, self._baseline, self.baseline_kind, data
            )
        ]
