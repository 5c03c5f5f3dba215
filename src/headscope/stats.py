"""Uncertainty for head scores: bootstrap intervals over examples."""

from __future__ import annotations

import numpy as np
import torch


def bootstrap_ratio_ci(
    sums: torch.Tensor,
    counts: torch.Tensor,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap of ``sum(sums) / sum(counts)`` resampling examples with replacement.

    ``sums`` is ``[E, ...]`` and ``counts`` is ``[E]``. Examples with no counted positions are
    dropped first. Resampling whole examples (sequences, sentences) rather than positions keeps
    the dependence between positions of one example inside the interval. Returns ``(low, high)``
    shaped like ``sums.shape[1:]``; NaN where nothing was counted.
    """
    keep = counts > 0
    sums_np = sums[keep].double().numpy()
    counts_np = counts[keep].double().numpy()
    shape = tuple(sums.shape[1:])
    n_examples = len(counts_np)
    if n_examples == 0:
        nan = np.full(shape, np.nan)
        return nan, nan.copy()
    if n_examples == 1 or n_resamples <= 0:
        point = sums_np.sum(0) / counts_np.sum()
        return point.copy(), point.copy()
    rng = np.random.default_rng(seed)
    # Each row of `weights` says how often each example is drawn in one resample.
    weights = rng.multinomial(n_examples, np.full(n_examples, 1.0 / n_examples), size=n_resamples)
    numerators = weights @ sums_np.reshape(n_examples, -1)
    denominators = weights @ counts_np
    ratios = numerators / np.maximum(denominators, 1e-12)[:, None]
    alpha = (1.0 - level) / 2.0
    low = np.quantile(ratios, alpha, axis=0).reshape(shape)
    high = np.quantile(ratios, 1.0 - alpha, axis=0).reshape(shape)
    return low, high
