"""Uncertainty for head scores: bootstrap intervals over examples."""

from __future__ import annotations

import numpy as np
import torch


def bootstrap_ratio(
    sums: torch.Tensor,
    counts: torch.Tensor,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile bootstrap of ``sum(sums) / sum(counts)`` resampling examples with replacement.

    ``sums`` is ``[E, ...]`` and ``counts`` is ``[E]``. Examples with no counted positions are
    dropped first. Resampling whole examples (sequences, sentences) rather than positions keeps
    the dependence between positions of one example inside the interval. Returns
    ``(low, high, se)`` shaped like ``sums.shape[1:]``: the interval and the bootstrap standard
    error; NaN where nothing was counted, and a zero-width interval with NaN SE for one example.
    """
    keep = counts > 0
    sums_np = sums[keep].double().numpy()
    counts_np = counts[keep].double().numpy()
    shape = tuple(sums.shape[1:])
    n_examples = len(counts_np)
    if n_examples == 0:
        nan = np.full(shape, np.nan)
        return nan, nan.copy(), nan.copy()
    if n_examples == 1 or n_resamples <= 1:
        point = sums_np.sum(0) / counts_np.sum()
        return point.copy(), point.copy(), np.full(shape, np.nan)
    rng = np.random.default_rng(seed)
    # Each row of `weights` says how often each example is drawn in one resample.
    weights = rng.multinomial(n_examples, np.full(n_examples, 1.0 / n_examples), size=n_resamples)
    numerators = weights @ sums_np.reshape(n_examples, -1)
    denominators = weights @ counts_np
    ratios = numerators / np.maximum(denominators, 1e-12)[:, None]
    alpha = (1.0 - level) / 2.0
    low = np.quantile(ratios, alpha, axis=0).reshape(shape)
    high = np.quantile(ratios, 1.0 - alpha, axis=0).reshape(shape)
    se = ratios.std(axis=0, ddof=1).reshape(shape)
    return low, high, se


def bootstrap_ratio_ci(
    sums: torch.Tensor, counts: torch.Tensor, *, n_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """The 95% (``level``) interval of :func:`bootstrap_ratio`."""
    low, high, _ = bootstrap_ratio(sums, counts, n_resamples=n_resamples, seed=seed, level=level)
    return low, high


def one_sided_p(score: np.ndarray, null: float | np.ndarray, se: np.ndarray) -> np.ndarray:
    """P(score this high | true score = null), normal approximation with bootstrap SE.

    A zero SE (every resample identical) gives p = 0 above the null and 1 otherwise.
    """
    from math import erfc, sqrt

    score = np.asarray(score, dtype=float)
    se = np.asarray(se, dtype=float)
    diff = score - null
    out = np.ones_like(score)
    positive_se = np.isfinite(se) & (se > 0)
    z = np.where(positive_se, diff / np.where(positive_se, se, 1.0), 0.0)
    out = np.where(positive_se, np.vectorize(lambda v: 0.5 * erfc(v / sqrt(2.0)))(z), out)
    out = np.where(~positive_se & (diff > 0), 0.0, out)
    return out


def benjamini_hochberg(p_values: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (false discovery rate) over all entries."""
    p = np.asarray(p_values, dtype=float).reshape(-1)
    m = len(p)
    if m == 0:
        return p.reshape(np.shape(p_values))
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1].clip(max=1.0)
    out = np.empty(m)
    out[order] = adjusted
    return out.reshape(np.shape(p_values))
