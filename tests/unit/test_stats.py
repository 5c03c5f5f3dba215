from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.errors import InputError
from headscope.verdicts.stats import (
    MIN_EXAMPLES,
    MIN_RESAMPLES,
    bootstrap_ratio,
    bootstrap_ratio_ci,
    check_resamples,
    one_sided_p,
)


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
    # Six examples with counts (the floor is five) and one without: the empty one is dropped.
    sums = torch.tensor([[1.0], [1.0], [1.0], [1.0], [1.0], [1.0], [0.0]], dtype=torch.float64)
    counts = torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.0], dtype=torch.float64)
    low, high = bootstrap_ratio_ci(sums, counts, n_resamples=MIN_RESAMPLES)
    assert low.tolist() == [0.5] and high.tolist() == [0.5]
    low, high = bootstrap_ratio_ci(sums[:0], counts[:0], n_resamples=MIN_RESAMPLES)
    assert np.isnan(low).all() and np.isnan(high).all()


@pytest.mark.parametrize("n_examples", [1, 2, MIN_EXAMPLES - 1])
def test_too_few_examples_give_no_interval_not_a_point(n_examples):
    """One to four examples used to return ci_low = ci_high = score (a zero-width "interval")."""
    gen = torch.Generator().manual_seed(0)
    sums = torch.rand(n_examples, 2, generator=gen, dtype=torch.float64) + 1.0
    counts = torch.full((n_examples,), 2.0, dtype=torch.float64)
    low, high, se = bootstrap_ratio(sums, counts, n_resamples=1000)
    assert np.isnan(low).all() and np.isnan(high).all() and np.isnan(se).all()
    # Nothing testable: p = 1 whatever the score, so no head can be "significant".
    assert (one_sided_p(np.array([0.9, 0.9]), 0.1, se) == 1.0).all()


@pytest.mark.parametrize("n_resamples", [0, 1, MIN_RESAMPLES - 1])
def test_too_few_resamples_give_no_interval(n_resamples):
    gen = torch.Generator().manual_seed(0)
    sums = torch.rand(30, 2, generator=gen, dtype=torch.float64)
    counts = torch.ones(30, dtype=torch.float64)
    low, high, se = bootstrap_ratio(sums, counts, n_resamples=n_resamples)
    assert np.isnan(low).all() and np.isnan(high).all() and np.isnan(se).all()


def test_resample_floor_refuses_one_to_199_and_allows_zero():
    check_resamples(0)
    check_resamples(MIN_RESAMPLES)
    for bad in (1, 2, MIN_RESAMPLES - 1, -1):
        with pytest.raises(InputError, match="--resamples"):
            check_resamples(bad)


def test_the_example_floor_is_the_smallest_n_a_sign_test_can_reject_at():
    """Why five: with n examples all above the null, the one-sided sign test gives p = 0.5**n."""
    assert 0.5**MIN_EXAMPLES < 0.05 <= 0.5 ** (MIN_EXAMPLES - 1)
