"""The shipped toy model: headscope must find the heads that train_toy.py measured."""

from __future__ import annotations

import json

from conftest import repeat_kv_order

from headscope import analyses


def heads(frame, detector, k):
    rows = frame[frame.detector == detector].sort_values("rank").head(k)
    return [(int(r.layer), int(r.head)) for r in rows.itertuples()]


def test_finds_the_induction_heads(toy, toy_truth):
    report = analyses.induction(toy, analyses.RepeatSpec(seq_len=24, n_seqs=16, seed=5), n_resamples=200)
    table = report.table
    # train_toy.py found every layer-1 head doing induction (> 0.8) and no layer-0 head doing it.
    truth = {tuple(int(x) for x in k[1:].split("H")): v for k, v in toy_truth["induction_scores"].items()}
    expected = sorted(h for h, v in truth.items() if v > 0.5)
    assert sorted(heads(table, "induction", len(expected))) == expected
    top = table[(table.detector == "induction") & (table["rank"] == 1)].iloc[0]
    assert (int(top["layer"]), int(top["head"])) in expected
    assert top.score > 0.8 and top.ci_low > top.baseline
    for (layer, head), value in truth.items():
        row = table[(table.detector == "induction") & (table.layer == layer) & (table["head"] == head)].iloc[
            0
        ]
        # The protocols differ (contiguous copies here, random gaps in training), so compare roles.
        assert (row.score > 0.5) == (value > 0.5), (layer, head, row.score, value)
    # In-context copying: the second copy is predicted far better than the first.
    assert report.loss is not None and report.loss.later < report.loss.first / 5


def test_finds_the_previous_token_head(toy, toy_truth, toy_texts, toy_dir):
    report = analyses.scan(toy, text_set=toy_texts, detector_names=["previous-token"], n_resamples=200)
    table = report.table
    assert heads(table, "previous-token", 1) == [tuple(toy_truth["previous_token_head"])]
    best = table[table["rank"] == 1].iloc[0]
    assert best.score > 0.8
    assert best.ci_low > 3 * best.baseline
    # The toy's config: 4 query heads over 2 KV heads, expanded in transformers' repeat_kv order.
    config = json.loads((toy_dir / "config.json").read_text())
    order = repeat_kv_order(config["num_attention_heads"], config["num_key_value_heads"])
    assert order == [0, 0, 1, 1]
    assert table.kv_group.tolist() == [order[h] for h in table["head"]]


def test_ablating_the_induction_heads_destroys_copying(toy, toy_truth):
    from headscope import capture
    from headscope.extend.ablation import later_copy_loss

    spec = analyses.RepeatSpec(seq_len=24, n_seqs=16, seed=9)
    sequences, specials, offset = analyses.repeated_tokens(toy, spec)
    batches = capture.make_batches(sequences, specials, batch_size=16, pad_id=0, is_causal=True)

    def loss(heads):
        ablation = capture.Ablation.of(heads) if heads else None
        total, tokens = later_copy_loss(toy, batches, spec, offset, len(sequences), ablation)
        return float(total.sum() / tokens.sum())

    truth = {tuple(int(x) for x in k[1:].split("H")): v for k, v in toy_truth["induction_scores"].items()}
    induction_heads = [h for h, v in truth.items() if v > 0.5]
    clean = loss([])
    first_copy = analyses.induction(toy, spec, n_resamples=0).loss.first
    ablated = loss(induction_heads)
    other = loss([(0, 0)])  # a layer-0 head that is neither induction nor previous-token
    # Copying is gone: most of the gap to the first (unseen) copy comes back.
    assert ablated - clean > 0.4 * (first_copy - clean), (clean, ablated, first_copy)
    # Removing an unrelated head barely matters.
    assert other - clean < 0.1 * (ablated - clean), (clean, other)
