"""Weight-only roles on the real bundled models (slow): SmolLM2-135M (GQA 9/3) and Gemma 3 270M (MQA,
(1 + w) norms, √d embedding scale, post-attention norms, 262k vocabulary)."""

from __future__ import annotations

import pytest

from headscope.analyses.weights import verify_successor, weights

pytestmark = pytest.mark.slow


def _check_shares(report) -> None:
    table = report.table
    shares = table[table.relation.isin(["copying", "suppression", "successor"])]
    assert len(shares) and shares.score.between(0, 1).all()
    assert (shares.ci_low <= shares.score + 1e-12).all() and (shares.score <= shares.ci_high + 1e-12).all()
    eigen = table[table.relation == "eigenvalue"]
    assert eigen.score.between(-1, 1).all()


def _top(report, relation: str, data: str = "vocab"):
    table = report.table
    rows = table[(table.relation == relation) & (table.data == data)]
    return rows.sort_values("score", ascending=False)


def test_smollm2_copying_and_suppression_heads(smollm2_scan):
    # The weight-only part of the shared SmolLM2 scan: weights() with its defaults (2,000 tokens,
    # k = 5, mlp0), bootstrapped by the scan (200 resamples). Gemma 3 below calls weights() itself.
    report = smollm2_scan
    _check_shares(report)
    outcome = report.outcomes["vocab"]
    assert outcome.tokens == 2000 and outcome.embedding == "mlp0"
    copying = _top(report, "copying")
    best = copying.iloc[0]
    baseline = best["baseline"]
    assert baseline == pytest.approx(5 / outcome.candidates)
    # The top copying heads beat the baseline (~1e-4) by a wide margin, interval and all.
    assert best["ci_low"] > 0.3 and best["ci_low"] > 1000 * baseline
    assert (copying.head(3).role == "copy").all()
    # The heads the IOI analysis found by behaviour: L24H4 writes against the name it reads
    # (negative name mover), L23H0 and L23H2 for it (name movers).
    supp = _top(report, "suppression")
    assert (24, 4) in set(zip(supp.head(2).layer, supp.head(2)["head"], strict=True))
    assert {(23, 0), (23, 2)} <= set(zip(copying.head(3).layer, copying.head(3)["head"], strict=True))
    # Chinese ordinals are not single tokens in SmolLM2's tokenizer: said, not scored.
    assert any("ordinal-zh" in note for note in report.notes)
    assert {t.task: t.qualified for t in outcome.tasks if t.data == "ordinal-en"}["weekdays"] == 7


def test_gemma3_weights_and_successor_verify(gemma3):
    report = weights(gemma3, tokens=300, n_resamples=1000)
    _check_shares(report)
    copying = _top(report, "copying")
    assert copying.iloc[0]["ci_low"] > 100 * copying.iloc[0]["baseline"]
    # MQA: every query head reads KV group 0.
    assert set(report.table.kv_group) == {0}
    zh = [t for t in report.outcomes["vocab"].tasks if t.data == "ordinal-zh"]
    assert {t.task: t.qualified for t in zh}["heavenly_stems"] == 10
    check = verify_successor(gemma3, report, "ordinal-zh", k=3, draws=1)
    assert check is not None and check.clean.n > 20
    assert 0.0 <= check.ablated.accuracy <= 1.0 and check.clean.loss > 0
