"""Head ablation (an edit, :mod:`headscope.capture.edits`): chosen heads' outputs replaced by zeros or
by their set-wide mean, inside the streaming attention function (no hook)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from headscope.errors import RunFailure

from .batch import Batch


@dataclass(frozen=True)
class AblateHeads:
    """Heads whose attention output is replaced: by zeros, or by its mean over the whole set.

    The replacement acts on each head's output before the output projection, so it removes
    exactly that head's contribution to the residual stream. Mean ablation replaces the output
    at position t by the head's mean output at position t over every sequence of the data set
    that reaches t, measured in a clean calibration pass (:func:`head_output_means`) before the
    ablated runs. It therefore does not depend on how the set is cut into batches.
    """

    heads: dict[int, tuple[int, ...]]  # layer -> query heads
    mode: str = "zero"  # "zero" or "mean"
    means: dict[tuple[int, int], torch.Tensor] | None = field(default=None, repr=False)  # [T, D]

    def __post_init__(self) -> None:
        if self.mode not in {"zero", "mean"}:
            raise ValueError(f"unknown ablation mode {self.mode!r}")
        if self.mode == "mean":
            missing = [
                (layer, head)
                for layer, heads in self.heads.items()
                for head in heads
                if self.means is None or (layer, head) not in self.means
            ]
            if missing:
                raise ValueError(f"mean ablation needs set-wide means for heads {missing}")

    @classmethod
    def of(
        cls,
        pairs: Iterable[tuple[int, int]],
        mode: str = "zero",
        means: dict[tuple[int, int], torch.Tensor] | None = None,
    ) -> AblateHeads:
        heads: dict[int, list[int]] = {}
        for layer, head in pairs:
            heads.setdefault(int(layer), []).append(int(head))
        chosen = {layer: tuple(sorted(set(h))) for layer, h in heads.items()}
        kept = None
        if means is not None:
            kept = {
                (layer, h): means[(layer, h)]
                for layer, hs in chosen.items()
                for h in hs
                if (layer, h) in means
            }
        return cls(chosen, mode, kept)

    def apply(self, layer: int, output: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``output`` is [B, H, T, D]; returns it with the ablated heads replaced."""
        heads = self.heads.get(layer)
        if not heads:
            return output
        output = output.clone()
        if self.mode == "zero":
            output[:, torch.tensor(heads, device=output.device)] = 0.0
            return output
        assert self.means is not None  # checked in __post_init__
        length = output.shape[2]
        for head in heads:
            mean = self.means[(layer, head)]
            if mean.shape[0] < length:
                raise RunFailure(
                    f"mean ablation: the calibration pass saw {mean.shape[0]} positions, this batch has {length}"
                )
            output[:, head] = mean[:length].to(device=output.device, dtype=output.dtype)
        return output


# The name the analyses have always used.
Ablation = AblateHeads


class HeadOutputMeans:
    """Running per-position sums of chosen heads' outputs over every real row of a data set."""

    def __init__(self, heads: Iterable[tuple[int, int]]) -> None:
        self.by_layer: dict[int, list[int]] = {}
        for layer, head in sorted(set(heads)):
            self.by_layer.setdefault(int(layer), []).append(int(head))
        self.sums: dict[int, torch.Tensor] = {}  # layer -> [heads, T, D] float64
        self.counts: dict[int, torch.Tensor] = {}  # layer -> [T]

    def add(self, layer: int, output: torch.Tensor, batch: Batch) -> None:
        heads = self.by_layer.get(layer)
        if not heads:
            return
        rows = batch.attention_mask.to(torch.float64)  # [B, T]: padding does not count
        part = torch.einsum("bhtd,bt->htd", output[:, heads].double(), rows).cpu()
        count = rows.sum(0).cpu()
        if layer not in self.sums:
            self.sums[layer], self.counts[layer] = part, count
            return
        # Batches differ in length: grow the running sums to the longer one (positions along dim 1).
        grown = max(self.sums[layer].shape[1], part.shape[1])
        self.sums[layer] = _grow(self.sums[layer], grown, 1) + _grow(part, grown, 1)
        self.counts[layer] = _grow(self.counts[layer], grown, 0) + _grow(count, grown, 0)

    def result(self) -> dict[tuple[int, int], torch.Tensor]:
        out = {}
        for layer, heads in self.by_layer.items():
            if layer not in self.sums:
                continue
            mean = self.sums[layer] / self.counts[layer].clamp(min=1)[None, :, None]
            for index, head in enumerate(heads):
                out[(layer, head)] = mean[index].float()
        return out


def _grow(values: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Zero-pad ``values`` along ``dim`` to ``length``."""
    missing = length - values.shape[dim]
    if missing == 0:
        return values
    shape = list(values.shape)
    shape[dim] = missing
    return torch.cat([values, values.new_zeros(shape)], dim=dim)
