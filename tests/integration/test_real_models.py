"""Slow: the two bundled real models, end to end. Run in CI too."""

from __future__ import annotations

import pytest
from conftest import repeat_kv_order

from headscope import analyses, detectors
from headscope.outputs.report import table_csv
from headscope.verdicts.results import CSV_COLUMNS

pytestmark = pytest.mark.slow


def test_smollm2_scan_every_head_every_detector(smollm2, smollm2_scan):
    layout = smollm2.layout
    assert (layout.n_layers, layout.n_heads, layout.n_kv_heads) == (30, 9, 3)
    assert smollm2.is_causal and smollm2.capture_mode == "stream"
    report = smollm2_scan  # analyses.scan(smollm2, n_resamples=200), shared with other tests
    table = report.table
    assert list(table.columns[: len(CSV_COLUMNS)]) == CSV_COLUMNS
    assert table_csv(table).splitlines()[0] == ",".join(CSV_COLUMNS)
    assert (table.role != "").any()
    groups = table.groupby(["data", "detector", "relation", "direction"]).size()
    assert set(groups) == {270}
    head_level = table[table.relation == ""].groupby("detector").size().to_dict()
    assert head_level == {
        "previous-token": 270,
        "duplicate-token": 270,
        "induction": 270,
        "sink": 270,
        "retrieval": 540,  # the short needle sweep, English and Chinese
    }
    assert {"syntax-en", "syntax-zh", "coref-en", "coref-zh", "ioi-en", "ioi-zh"} <= set(table.data)
    assert {"retrieval-en", "retrieval-zh"} <= set(table.data)
    assert {"retr", "nm", "neg", "sinh"} <= set(table.role)
    # The weight-only roles come with every scan: L24H4 suppresses, L23H2 copies (see README).
    assert {"copy", "supp"} <= set(table.role)
    assert set(report.outcomes) == {"ioi-en", "ioi-zh", "retrieval-en", "retrieval-zh", "vocab"}
    assert report.outcomes["ioi-en"].accuracy >= 0.9
    # nats, attention differences, and the eigenvalue score in [-1, 1]
    signed = table.relation.isin(["dla", "s-inhibition", "eigenvalue"])
    for key, group in table.groupby(["data", "detector", "relation", "direction"]):
        assert sorted(group["rank"]) == list(range(1, 271)), key
        if not signed[group.index].any():
            assert group.score.between(0, 1 + 1e-6).all()
    for detector, group in table[table.relation == ""].groupby("detector"):
        best = group[group["rank"] == 1].iloc[0]
        # Each role exists in a 135M model and stands far above uniform attention.
        assert best.ci_low > 3 * best.baseline, (detector, best.score, best.baseline)
    # GQA: 9 query heads over 3 KV heads, in the order transformers' repeat_kv expands them.
    order = repeat_kv_order(9, 3)
    assert table.kv_group.tolist() == [order[h] for h in table["head"]]


def test_smollm2_induction_heads_carry_in_context_copying(smollm2):
    report = analyses.induction(
        smollm2, analyses.RepeatSpec(seq_len=50, repeats=3, n_seqs=8), n_resamples=200
    )
    induction = report.table[report.table.detector == "induction"].sort_values("rank")
    assert induction.iloc[0].score > 0.5
    # An induction head composes with an earlier layer's previous-token output (Olsson et al.
    # 2022), so none sits in layer 0. (The old bar, layer >= 5, was read off one run.)
    assert induction.head(5).layer.min() >= 1
    loss = report.loss
    assert loss is not None and len(loss.per_copy) == 3
    assert loss.later < loss.first / 3, loss.per_copy


def test_minilm_encoder_scan(minilm):
    layout = minilm.layout
    assert (layout.n_layers, layout.n_heads, layout.n_kv_heads) == (6, 12, 12)
    assert not minilm.is_causal
    report = analyses.scan(minilm, n_resamples=200)
    table = report.table
    counts = table[table.relation == ""].groupby("detector").size().to_dict()
    # The detectors that read the natural text or the repeated tokens (the circuit ones need a causal LM).
    token_level = {
        n for n, c in detectors.REGISTRY.items() if c.default_source in {"text", "repeated-tokens"}
    }
    assert set(counts.values()) == {72} and set(counts) == token_level
    # The circuit analyses read next-token predictions: an encoder gets a note, not a crash.
    assert any(n.startswith("ioi, retrieval: not run") for n in report.notes), report.notes
    assert any(n.startswith("weights: not run") for n in report.notes), report.notes
    assert set(table.groupby(["data", "detector", "relation", "direction"]).size()) == {72}
    previous = table[table.detector == "previous-token"].sort_values("rank").iloc[0]
    # BERT-style models have strong previous-token heads (Clark et al. 2019).
    assert previous.score > 0.5 and previous.ci_low > 5 * previous.baseline
    # MHA: every one of the 12 heads has its own KV head.
    assert table.kv_group.tolist() == [repeat_kv_order(12, 12)[h] for h in table["head"]]
    assert report.loss is None


def test_smollm2_top5_induction_ablation_beats_random_control(smollm2):
    from headscope.extend.ablation import ablate
    from headscope.verdicts.heads import top_heads

    spec = analyses.RepeatSpec(seq_len=50, n_seqs=8, seed=0)
    report = analyses.induction(smollm2, spec, n_resamples=0)
    heads = top_heads(report.table, "induction", 5)
    result = ablate(smollm2, spec, heads, draws=3, batch_size=8, n_resamples=200)
    print("clean", result.clean.mean, "top5", result.topk.mean, "random5", result.random.mean)
    assert result.topk_effect > 5 * max(result.random_effect, 0.01)
    assert result.topk.ci[0] > result.clean.ci[1]
    payload = result.to_json()
    for key in ("clean_loss", "topk_loss", "random_loss", "topk_heads", "random_heads"):
        assert key in payload
    assert len(payload["random_heads"]) == 3 and all(len(d) == 5 for d in payload["random_heads"])
    top_layers = {layer for layer, _ in heads}
    assert all(layer in top_layers for draw in payload["random_heads"] for layer, _ in draw)
