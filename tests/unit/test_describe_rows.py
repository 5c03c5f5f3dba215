"""describe reads a seeded sample of query rows per window: the estimate of each head's mean over its
queries. With at least as many rows as the window it is the all-rows value exactly; otherwise it
stays close to it, and the capture computes exact weights for the sampled rows only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.analyses.describe.fit import BLOCK, RowSample
from headscope.capture import make_batches, rows


def _batch(lengths, first=0):
    seqs = [[1] + [5] * (n - 1) for n in lengths]
    (batch,) = make_batches(
        seqs, [[True] + [False] * (n - 1) for n in lengths], batch_size=len(seqs), pad_id=0, is_causal=True
    )
    batch.example_index = batch.example_index + first
    return batch


def test_enough_rows_read_every_real_row():
    batch = _batch([40, 33])
    read = RowSample(40, seed=3)(batch)
    assert torch.equal(read, batch.attention_mask.bool())
    assert torch.equal(RowSample(None)(batch), batch.attention_mask.bool())


def test_every_position_has_the_same_chance_to_be_read():
    length, wanted = 200, 48
    counts = np.zeros(length)
    draws = 600
    for seed in range(draws):
        read = RowSample(wanted, seed=seed)(_batch([length]))[0].numpy()
        counts += read
        # Blocks of consecutive rows: few spans for the capture.
        assert len(rows.spans(torch.from_numpy(read)[None])) <= length // BLOCK
    stride = round(length * BLOCK / wanted)
    share = counts / draws
    assert share.mean() == pytest.approx(BLOCK / stride, abs=0.01)
    # Equal inclusion everywhere (the sample mean is unbiased); 600 draws of a Bernoulli(~0.24).
    assert np.abs(share - BLOCK / stride).max() < 0.08
    # Same seed, same rows; another seed, other rows.
    a, b = RowSample(wanted, seed=1)(_batch([length])), RowSample(wanted, seed=1)(_batch([length]))
    assert torch.equal(a, b)
    others = {tuple(RowSample(wanted, seed=s, salt=1)(_batch([length]))[0].tolist()) for s in range(5)}
    assert len(others) > 1


def _describe(toy, toy_texts, **kw):
    import headscope as hs

    result = hs.describe(toy, eval_text=toy_texts, context=96, windows=4, resamples=0, **kw)
    atlas = result.state["atlas"]
    explained = np.array([h["explained"]["value"] for h in atlas.heads])
    off = np.array([h["explained_off_first"]["value"] for h in atlas.heads])
    return atlas, explained, off


@pytest.fixture(scope="module")
def every_row(toy, toy_texts):
    return _describe(toy, toy_texts, rows=0)


def test_rows_at_least_the_window_give_the_all_rows_value(toy, toy_texts, every_row):
    atlas, explained, off = _describe(toy, toy_texts, rows=97)  # windows are 97 tokens with BOS
    np.testing.assert_array_equal(explained, every_row[1])
    np.testing.assert_array_equal(off, every_row[2])
    assert atlas.evaluation["rows_per_window"] == 97
    assert every_row[0].evaluation["rows_per_window"] is None
    assert atlas.evaluation["queries"] == every_row[0].evaluation["queries"]


def test_the_capture_computes_the_sampled_rows_only(toy, toy_texts):
    with rows.counting() as counts:
        atlas, explained, _ = _describe(toy, toy_texts, rows=32)
    # 32 of 97 rows per window: about a third got exact weights, the rest ran fused.
    assert counts.total_exact < 0.5 * (counts.total_exact + counts.total_fused)
    assert atlas.evaluation["rows_per_window"] == 32
    # The reference path (every row exact) reads the same sample: the same numbers.
    with rows.full_maps():
        _, full, _ = _describe(toy, toy_texts, rows=32)
    np.testing.assert_allclose(full, explained, atol=1e-6)


def test_sampled_rows_estimate_the_all_rows_value(toy, toy_texts):
    """One description (fitted on every row), measured on a quarter of the rows: each seed's
    estimate stays near the all-rows value (the estimator; 24 seeds average to within 0.003)."""
    from headscope.analyses.describe import _pass
    from headscope.analyses.describe.fit import EvalStats, FitStats, TemplateMaps, bootstrap_shares, fit
    from headscope.analyses.describe.templates import chosen_templates
    from headscope.analyses.describe.texts import user_text_sources, windows

    texts = windows(toy, user_text_sources(toy_texts), 64)  # 19 windows of 65 tokens
    templates = chosen_templates(True)
    stats = FitStats(TemplateMaps(templates, texts), texts, 2, 4)
    _pass(toy, texts, [stats], RowSample(None), 4, None, "fit")
    fitted = fit(stats)

    def measure(sample):
        found = EvalStats(TemplateMaps(templates, texts), texts, fitted, 2, 4, sample)
        _pass(toy, texts, [found], sample, 4, None, "evaluate")
        share = bootstrap_shares(found.explained, found.counts, 0, 0)[0]
        off = bootstrap_shares(found.off_explained, found.off_total, 0, 0)[0]
        return share, off, float(found.counts.sum())

    every, every_off, n_all = measure(RowSample(None))
    for seed in range(4):
        share, off, n = measure(RowSample(16, seed=seed, salt=1))
        assert n < 0.3 * n_all
        assert abs(share.mean() - every.mean()) < 0.04, seed
        assert np.abs(share - every).max() < 0.1, seed
        assert np.abs(off - every_off).max() < 0.1, seed
