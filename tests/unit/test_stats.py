from __future__ import annotations

import numpy as np
import torch

from headscope.stats import bootstrap_ratio_ci


def test_interval_brackets_the_point_and_is_reproducible():
    gen = torch.Generator().manual_seed(1)
    sums = torch.rand(40, 3, 2, generator=gen, dtype=torch.float64) * 10
    counts = torch.full((40,), 10.0, dtype=torch.float64)
    point = (sums.sum(0) / counts.sum()).numpy()
    low, high = bootstrap_ratio_ci(sums, counts, n_resamples=500, seed=3)
    assert np.all(low <= point) and np.all(point <= high)
    assert np.all(high - low > 0)
    low2, high2 = bootstrap_ratio_ci(sums, counts, n_resamples=500, seed=3)
    assert np.array_equal(low, low2) and np.array_equal(high, high2)
    low3, _ = bootstrap_ratio_ci(sums, counts, n_resamples=500, seed=4)
    assert not np.array_equal(low, low3)


def test_constant_examples_give_a_zero_width_interval():
    sums = torch.full((10, 2, 2), 3.0, dtype=torch.float64)
    counts = torch.full((10,), 4.0, dtype=torch.float64)
    low, high = bootstrap_ratio_ci(sums, counts, n_resamples=200, seed=0)
    assert np.allclose(low, 0.75) and np.allclose(high, 0.75)


def test_examples_without_counts_are_ignored_and_empty_is_nan():
    sums = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    counts = torch.tensor([2.0, 0.0], dtype=torch.float64)
    low, high = bootstrap_ratio_ci(sums, counts, n_resamples=50)
    assert low.tolist() == [0.5] and high.tolist() == [0.5]
    low, high = bootstrap_ratio_ci(sums[:0], counts[:0], n_resamples=50)
    assert np.isnan(low).all() and np.isnan(high).all()
