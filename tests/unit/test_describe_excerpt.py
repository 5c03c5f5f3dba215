"""The card's heatmaps: describe records, during its evaluation pass, one excerpt per window (its
middle tokens), and gives each head the excerpt where its attention off the first token is largest,
with the actual map and the description's prediction on the same cells, stored as uint8."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_describe_fit import TEMPLATES, _text, planted

from headscope.analyses.describe.atlas import Atlas, _excerpt, _excerpts, excerpt_maps
from headscope.analyses.describe.fit import (
    EXCERPT,
    EvalStats,
    ExcerptRows,
    FitStats,
    TemplateMaps,
    excerpt_span,
    fit,
    query_classes,
)
from headscope.capture import make_batches


def _stream(texts, readers, sink_except: int | None = None, chunk: int = 16):
    """The planted heads of test_describe_fit, in query chunks; with ``sink_except``, head 0 is
    offset-1 in that window only and a pure sink in every other one."""
    batches = make_batches(
        [t.ids for t in texts], [t.special for t in texts], batch_size=2, pad_id=0, is_causal=True
    )
    for batch in batches:
        length = batch.input_ids.shape[1]
        probs, _, _ = TemplateMaps(TEMPLATES, texts).normalised(batch, 0, length, length)
        attn = planted(probs, query_classes(batch, texts, 0, length))
        if sink_except is not None:
            for row, example in enumerate(batch.example_index.tolist()):
                if example != sink_except:
                    attn[row, 0] = 0.0
                    attn[row, 0, :, 0] = 1.0
        for layer in range(2):
            for start in range(0, length, chunk):
                stop = min(start + chunk, length)
                for reader in readers:
                    reader.update(layer, attn[:, :, start:stop, :stop].contiguous(), batch, start)


@pytest.fixture(scope="module")
def measured():
    fit_texts = [_text(f"fit{i}", 60, i) for i in range(4)]
    stats = FitStats(TemplateMaps(TEMPLATES, fit_texts), fit_texts, 2, 4)
    _stream(fit_texts, [stats])
    fitted = fit(stats, min_class_queries=10)
    texts = [_text(f"eval{i}", 150, 20 + i) for i in range(3)]
    found = EvalStats(TemplateMaps(TEMPLATES, texts), texts, fitted, 2, 4, None, ExcerptRows(texts))
    _stream(texts, [found], sink_except=1, chunk=7)
    return found, texts


def test_the_excerpt_is_the_middle_of_the_window_and_never_the_first_token():
    assert excerpt_span(385) == (168, 216)  # 48 tokens in the middle of a 384-token window (+ BOS)
    assert excerpt_span(97) == (42, 54)  # at most an eighth of a short window
    start, stop = excerpt_span(2)
    assert start >= 1 and stop - start == 1
    assert all(stop - start <= EXCERPT for start, stop in map(excerpt_span, range(2, 2000, 37)))


def test_each_head_gets_the_excerpt_where_its_attention_off_the_first_token_is_largest(measured):
    found, texts = measured
    layer = 1
    entry = _excerpt(found, layer, 0)["excerpt"]
    # Head 0 is a sink everywhere but window 1, where it is offset-1.
    assert entry["index"] == 1
    assert entry["off_first"] == pytest.approx(1.0)
    assert float(found.excerpt_off_first[0, layer, 0]) == 0.0
    assert float(found.excerpt_off_first[2, layer, 0]) == 0.0
    # A head that is never a sink (self + broad) has off-first attention in every window.
    assert (found.excerpt_off_first[:, layer, 3] > 0).all()


def test_actual_and_predicted_maps_share_the_excerpts_cells(measured):
    found, texts = measured
    atlas = Atlas(
        model="planted",
        layout={"layers": 2, "heads": 4, "kv_heads": 1, "causal": True},
        templates=[],
        heads=[],
        explained={},
        explained_off_first={},
        explained_unconditioned={},
        fit={},
        evaluation={},
        excerpts=_excerpts(found, texts),
    )
    head = _excerpt(found, 1, 0)
    maps = excerpt_maps(atlas.excerpts, head)
    start, stop = excerpt_span(len(texts[1]))
    n = stop - start
    assert maps["start"] == start and maps["window"] == "eval1"
    assert maps["tokens"] == [texts[1].pieces[0], *texts[1].pieces[start:stop]]
    assert maps["actual"].shape == maps["predicted"].shape == (n, n + 1)
    assert maps["explained"].shape == (n,)
    # offset-1: excerpt query i looks at excerpt key i - 1, drawn in column i (column 0 is the
    # first token); the excerpt's first query looks before the excerpt, at nothing drawn.
    expected = np.zeros((n, n + 1))
    expected[np.arange(1, n), np.arange(1, n)] = 1.0
    np.testing.assert_array_equal(maps["actual"], expected)
    np.testing.assert_allclose(maps["predicted"], expected, atol=0.06)  # the fit recovers it within 0.05
    assert maps["explained"].min() > 0.9  # every query's share over all its keys, not only the drawn ones
    # A sink window's map would be all first-token column: not the one chosen.
    sink = found.excerpt_actual[0][1, 0].float().numpy()
    assert sink[:, 0].min() == pytest.approx(1.0) and sink[:, 1:].max() == 0.0


def test_the_mixture_head_is_predicted_on_the_same_scale(measured):
    """0.6 sink + 0.4 offset-1: actual and prediction agree cell by cell (uint8: within 1/255)."""
    found, texts = measured
    layer, head = 0, 1
    index = _excerpt(found, layer, head)["excerpt"]["index"]
    actual = found.excerpt_actual[index][layer, head].float()
    predicted = found.excerpt_predicted[index][layer, head].float()
    assert torch.allclose(actual[1:, 0], torch.full_like(actual[1:, 0], 0.6), atol=1e-3)
    assert torch.allclose(predicted, actual, atol=0.05)


def test_describe_on_the_toy_stores_every_heads_maps_and_reads_them_back(toy, toy_texts):
    import headscope as hs

    result = hs.describe(toy, eval_text=toy_texts, context=96, windows=4, resamples=0)
    atlas = result.state["atlas"]
    data = atlas.to_json()  # checked against the schema on write
    assert len(data["excerpts"]) == atlas.evaluation["windows"]
    back = Atlas.from_json(data)  # and on read
    for head in back.heads:
        maps = excerpt_maps(back.excerpts, head)
        n = len(maps["tokens"]) - 1
        assert maps["actual"].shape == maps["predicted"].shape == (n, n + 1)
        # Rows are attention on some of the keys: at most 1 (plus the uint8 rounding of each cell).
        assert maps["actual"].sum(1).max() <= 1 + (n + 1) / 510
    # A damaged map is refused naming the path.
    data["heads"][3]["excerpt"]["actual"] = data["heads"][3]["excerpt"]["actual"][:-8]
    with pytest.raises(Exception, match=r"heads\[3\]\.excerpt\.actual"):
        Atlas.from_json(data, "x.json")


def test_reading_the_excerpts_changes_no_share_and_scan_reads_none(toy, toy_texts):
    """The excerpt rows are read besides the sampled rows: every share is what it is without them
    (the statistics and the detectors riding along see the sample only); scan reads no excerpts."""
    from headscope.analyses.describe import describe_heads
    from headscope.analyses.describe.texts import user_text_sources
    from headscope.extend.base import detectors_for

    sources = user_text_sources(toy_texts)
    found = {}
    for heatmaps in (True, False):
        riding = detectors_for("text", None)  # describe's own riders
        atlas, _ = describe_heads(
            toy, sources, sources, eval_from="x", context=96, windows_per_split=4, rows=32,
            n_resamples=0, detectors=riding, heatmaps=heatmaps,
        )  # fmt: skip
        scores = [r for d in riding for r in d.results("x")]
        found[heatmaps] = (atlas, scores)
    with_maps, without = found[True][0], found[False][0]
    assert with_maps.excerpts is not None and without.excerpts is None
    assert all("excerpt" in h for h in with_maps.heads) and not any("excerpt" in h for h in without.heads)
    for a, b in zip(with_maps.heads, without.heads, strict=True):
        assert a["explained"] == b["explained"] and a["explained_off_first"] == b["explained_off_first"]
    assert found[True][1]
    for a, b in zip(found[True][1], found[False][1], strict=True):
        # The same rows, so the same sums; only float32 rounding differs where chunks are cut otherwise.
        assert torch.equal(a.counts, b.counts), a.detector
        torch.testing.assert_close(a.sums, b.sums, rtol=0, atol=1e-6)
