"""qk on the bundled models: SmolLM2's induction head L18H6 takes its keys from the previous-token head
L16H0, and removing L16H0 from its key input moves its attention far more than random sources do;
the decomposition is exact on Gemma 3 (q/k norms, MQA, sliding windows)."""

from __future__ import annotations

import pytest

import headscope as hs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_qk(smollm2):
    return hs.qk(
        smollm2,
        heads="L18H6",
        repeat_seq=2,
        seq_len=30,
        windows=5,
        rows=32,
        resamples=200,
        verify=1,
        controls=3,
    )


def test_the_induction_head_takes_its_keys_from_the_previous_token_head(smollm2_qk):
    found = smollm2_qk.qk
    assert found.check["score_error"] < 1e-5 and found.check["attention_error"] < 1e-4
    entry = found.head(18, 6)
    top = entry["key"][0]
    assert top["source"] == "L16H0" and top["role"] == "previous-token"
    assert top["ci_low"] is not None and top["ci_low"] > 0.15  # measured 0.35 [0.33, 0.37] at 50 tokens
    keys = {item["source"] for item in entry["key"][:4]}
    assert "L17H8" in keys  # the second previous-token head the issue names


def test_removing_it_from_the_key_input_moves_the_head_more_than_random_sources(smollm2_qk):
    (check,) = smollm2_qk.checks
    (removal,) = check.value.heads
    assert (removal.layer, removal.head, removal.source) == (18, 6, "L16H0")
    assert removal.ci_low is not None and removal.ci_low > 5  # measured 57 [45, 79]
    # Over the second copy's rows, as the issue measured it with plain hooks (0.915): 0.918 here
    # (0.493 when the first copy's rows, where the head rests on the first token, were averaged in).
    assert removal.rows == "the later copies' query rows (positions 31-60)" and removal.move > 0.8


@pytest.mark.parametrize(
    ("name", "heads"), [("smollm2", "L18H6,L29H2"), ("gemma3", "L6H0,L4H1"), ("minilm", "L3H3,L5H0")]
)
def test_the_pull_back_gives_the_projection_paths_shares(name, heads, request):
    """qk's shares come from one pull-back per head and side; projecting every source through the
    queries and keys (the path it replaced, kept as the oracle) gives the same shares, intervals,
    reconstruction and pairs to 1e-6 on the three bundled models (a sliding layer of Gemma 3: L4)."""
    from headscope.analyses.qk import oracle_gap

    loaded = request.getfixturevalue(name)
    options = dict(heads=heads, repeat_seq=2, seq_len=12, windows=2, rows=8, resamples=200)
    assert oracle_gap(loaded, **options) <= 1e-6


def test_gemma3_scores_are_the_sum_over_sources(gemma3):
    found = hs.qk(gemma3, heads="L6H0,L5H3", repeat_seq=2, seq_len=20, windows=2, rows=16, resamples=0).qk
    assert found.check["score_error"] < 1e-5 and found.check["attention_error"] < 1e-4
    for layer, head in ((6, 0), (5, 3)):
        entry = found.head(layer, head)
        assert sum(item["share"] for item in entry["key"]) == pytest.approx(1.0, abs=1e-5)
