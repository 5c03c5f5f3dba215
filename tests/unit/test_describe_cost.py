"""The fused path's cost on a padded batch (describe's windows: a source's tail is shorter than the
others): the rows of the batch whose mask is causal over a chunk take the causal split, the padded
rows keep the mask, and the output is the masked kernel's."""

from __future__ import annotations

import torch

from headscope.capture import stream


def _padded_mask(lengths: list[int], total: int) -> torch.Tensor:
    q = torch.arange(total)[:, None]
    k = torch.arange(total)[None, :]
    rows = [((k <= q) & (k < n))[None] for n in lengths]
    return torch.stack(rows)  # [B, 1, T, T]


def _layer(mask: torch.Tensor, seed: int = 0) -> stream._Layer:
    g = torch.Generator().manual_seed(seed)
    b, t = mask.shape[0], mask.shape[-1]
    q, k, v = (torch.randn(b, 3, t, 8, generator=g) for _ in range(3))
    return stream._Layer(None, 0, None, q, k, v, mask, 8**-0.5, None, None, 3)


def _reference(layer: stream._Layer, start: int, stop: int) -> torch.Tensor:
    allowed = layer.mask[:, :, start:stop, :stop]
    out = torch.nn.functional.scaled_dot_product_attention(
        layer.query[:, :, start:stop],
        layer.key[:, :, :stop],
        layer.value[:, :, :stop],
        attn_mask=allowed,
        scale=layer.scaling,
    )
    return out


def test_padded_batch_splits_rows_and_matches_the_masked_kernel():
    mask = _padded_mask([24, 24, 11, 24], 24)
    layer = _layer(mask)
    for start, stop in [(4, 9), (9, 17), (17, 24)]:
        split, rest = stream._causal_rows(mask, start, stop, 0, stop, None)
        if stop <= 11:
            assert split is None and rest is None  # every row causal over the chunk
        else:
            assert split.tolist() == [0, 1, 3] and rest.tolist() == [2]
        output = torch.zeros_like(layer.query)
        lse = torch.zeros(4, 3, 24)
        layer.fused(output, start, stop, 0, stop, lse=lse, causal=split is None and stop <= 11)
        torch.testing.assert_close(
            output[:, :, start:stop], _reference(layer, start, stop), atol=1e-5, rtol=1e-5
        )
        # the log-sum-exp of each row, as the pairs path reads it
        scores = layer.query[:, :, start:stop] @ layer.key[:, :, :stop].transpose(-1, -2) * layer.scaling
        scores = scores.masked_fill(~mask[:, :, start:stop, :stop], float("-inf"))
        torch.testing.assert_close(lse[:, :, start:stop], torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)


def test_no_row_causal_keeps_the_mask():
    mask = _padded_mask([5, 6], 12)
    assert stream._causal_rows(mask, 8, 12, 0, 12, None) == (None, None)
