"""Long contexts on SmolLM2: query-selective capture gives the full-map path's numbers at 4,096 tokens.

Retrieval reads only the answer positions: with selective capture (the default) those few rows
get exact weights and the other ~4,000 rows of every layer run through the fused SDPA kernel. Its
table (scores, intervals, roles) and needle accuracy must equal the path that computes every
row's weights, to 1e-6; the rows computed each way are counted.

One prompt: a second doubles the test's time (58.6 s selective + 66.5 s full against 28.7 + 32.8 s
on 2026-12-05, one thread) and adds only a two-row batch, whose padding the toys' retrieval test
(tests/unit/test_rows.py) and every family's conformance check already hold to the full maps.
"""

from __future__ import annotations

import pandas as pd
import pytest

import headscope as hs
from headscope.capture import rows

pytestmark = pytest.mark.slow


def test_smollm2_retrieval_at_4k_tokens_equals_the_full_map_path(smollm2):
    options = {"context": "4096", "depths": "0.5", "needles": 1, "resamples": 0}
    hs.retrieval(smollm2, context="256", depths="0.5", needles=1, resamples=0)  # warm-up, outside the counts
    with rows.counting() as counts:
        selective = hs.retrieval(smollm2, **options)
    with rows.full_maps(), rows.counting() as full_counts:
        full = hs.retrieval(smollm2, **options)
    layers = smollm2.layout.n_layers
    assert full_counts.total_fused == 0
    assert counts.total_exact + counts.total_fused == full_counts.total_exact
    # The prompt's answer rows only, in each layer.
    assert 0 < counts.total_exact / layers <= 20
    assert counts.total_fused / layers >= 4000
    pd.testing.assert_frame_equal(selective.table, full.table, check_exact=False, atol=1e-6, rtol=0)
    pd.testing.assert_frame_equal(selective.roles, full.roles)
    (sel_outcome,) = selective.report.outcomes.values()
    (full_outcome,) = full.report.outcomes.values()
    assert sel_outcome.accuracy == full_outcome.accuracy and sel_outcome.counted == full_outcome.counted
    assert sel_outcome.answer_loss == pytest.approx(full_outcome.answer_loss, abs=1e-5)
    assert max(selective.table["score"]) > 0.5  # the heads found at 4k are real retrieval heads
