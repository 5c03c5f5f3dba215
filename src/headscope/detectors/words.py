"""Word-level attention for detectors that score whole words (syntax, coreference).

Token attention arrives in query chunks; the word map ``from_word.T @ attn @ to_word`` is a sum
over query rows, so each chunk adds its share and the detector scores the finished ``[B, H, W, W]``
map at the end of the layer.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from headscope.capture import Batch
from headscope.data.align import pad_maps, word_attention
from headscope.detectors.base import Detector


def word_maps(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded (to_word, from_word, real-word mask) for a batch whose meta holds the maps."""
    if "word_maps" not in batch._cache:
        length = batch.input_ids.shape[1]
        device = batch.input_ids.device
        to_word = pad_maps([m["to_word"] for m in batch.meta], length).to(device)
        from_word = pad_maps([m["from_word"] for m in batch.meta], length).to(device)
        n_words = torch.tensor([m["to_word"].shape[1] for m in batch.meta], device=device)
        word_mask = torch.arange(to_word.shape[2], device=device)[None, :] < n_words[:, None]
        batch._cache["word_maps"] = to_word
        batch._cache["from_word"] = from_word
        batch._cache["word_mask"] = word_mask
    return batch._cache["word_maps"], batch._cache["from_word"], batch._cache["word_mask"]


class WordLevelDetector(Detector):
    """A detector that reads word-to-word attention rows; subclasses implement ``score_words``."""

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        to_word, from_word, _ = word_maps(batch)
        stop = q_start + attn.shape[2]
        part = word_attention(attn, to_word[:, : attn.shape[3]], from_word[:, q_start:stop])
        # A token's attention to itself is self-attention, whatever words it covers: where one
        # token spans two words (BPE merges 的画), it must not count as attention from one of
        # them to the other. So self is removed at the token level, before pooling into words.
        self_weight = attn.diagonal(offset=q_start, dim1=2, dim2=3)  # [B, H, c]
        rows = from_word[:, q_start:stop].to(attn.dtype)  # [B, c, W]
        cols = to_word[:, q_start:stop].to(attn.dtype)  # [B, c, W]
        part -= torch.einsum("bcw,bhc,bcv->bhwv", rows, self_weight, cols)
        words = getattr(self, "_words", None)
        self._words = part if words is None else words.add_(part)

    def end_layer(self, layer: int, batch: Batch) -> None:
        words, self._words = getattr(self, "_words", None), None
        if words is not None:
            self.score_words(layer, words, batch)

    @abstractmethod
    def score_words(self, layer: int, scores: torch.Tensor, batch: Batch) -> None:
        """Score one layer's word attention ``[B, H, W, W]`` (row = from word, column = to word)."""
