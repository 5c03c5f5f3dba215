"""Uncertainty for head scores: bootstrap intervals over examples.

Two floors keep an interval from claiming more than the data holds:

* ``MIN_EXAMPLES`` (5) independent examples. Below it no interval is reported and no role can be
  given. The reason is distribution-free: with n examples that *all* lie above the null, the
  one-sided sign test gives p = 0.5**n, which first drops below 0.05 at n = 5. With fewer
  examples no test that does not assume a distribution can be significant, and the percentile
  bootstrap of 1–4 examples only restates the examples themselves (one example: a point).
* ``MIN_RESAMPLES`` (200) bootstrap resamples. A 95% percentile interval reads the 2.5% and
  97.5% quantiles; with 200 resamples each tail holds 5 draws, the fewest for which a quantile is
  more than one extreme value. ``0`` is allowed and means "no intervals, no roles" (fast scores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the CLI imports this module before torch is needed
    import torch

MIN_EXAMPLES = 5
MIN_RESAMPLES = 200


def interval_unavailable_reason(n_examples: int, n_resamples: int) -> str | None:
    """Why a table gets no intervals (and so no roles), or None when it gets them."""
    if n_resamples == 0:
        return "--resamples 0: no intervals, no roles"
    if n_examples < MIN_EXAMPLES:
        return (
            f"{n_examples} example{'s' if n_examples != 1 else ''} < {MIN_EXAMPLES}: too few to test "
            "(no intervals, no roles)"
        )
    return None


def check_resamples(n_resamples: int) -> None:
    """Refuse a resample count between 1 and the floor (0 means: no intervals)."""
    from headscope.errors import InputError

    if n_resamples < 0 or 0 < n_resamples < MIN_RESAMPLES:
        raise InputError(
            f"--resamples {n_resamples} is too few for a 95% interval",
            hint=f"use at least {MIN_RESAMPLES}, or 0 for scores without intervals or roles",
        )


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
    error. All three are NaN where the interval is unavailable: nothing counted, fewer than
    ``MIN_EXAMPLES`` examples with counts, or ``n_resamples`` below ``MIN_RESAMPLES``.
    """
    keep = counts > 0
    sums_np = sums[keep].double().numpy()
    counts_np = counts[keep].double().numpy()
    shape = tuple(sums.shape[1:])
    n_examples = len(counts_np)
    if n_examples < MIN_EXAMPLES or n_resamples < MIN_RESAMPLES:
        nan = np.full(shape, np.nan)
        return nan, nan.copy(), nan.copy()
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

    A zero SE (every resample identical, from at least ``MIN_EXAMPLES`` examples) gives p = 0
    above the null and 1 otherwise. A missing (NaN) SE means nothing could be tested: p = 1.
    """
    from math import erfc, sqrt

    score = np.asarray(score, dtype=float)
    se = np.asarray(se, dtype=float)
    diff = score - null
    out = np.ones_like(score)
    positive_se = np.isfinite(se) & (se > 0)
    z = np.where(positive_se, diff / np.where(positive_se, se, 1.0), 0.0)
    out = np.where(positive_se, np.vectorize(lambda v: 0.5 * erfc(v / sqrt(2.0)))(z), out)
    out = np.where((se == 0) & (diff > 0), 0.0, out)
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
