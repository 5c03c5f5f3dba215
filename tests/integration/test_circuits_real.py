"""Circuit heads in the real bundled models: needle in a haystack and IOI on SmolLM2-135M.

Reference, measured outside headscope: SmolLM2 gets 120 of 120 prompts of a four-template IOI
set right (mean logit difference about 5.2 nats) and finds 12 of 12 six-digit needles at about
800 tokens. Both parts are read from the shared SmolLM2 scan (its needles are at 1,000 tokens),
not run again here.
"""

from __future__ import annotations

import pytest

from headscope.analyses import top_heads
from headscope.analyses.ioi import verify_ioi
from headscope.analyses.retrieval import ablate_retrieval

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def needles_en(smollm2_scan):
    """The English needle part of the shared SmolLM2 scan: 6 six-digit needles at depths 0.25 and
    0.75 of a 1,000-token haystack (12 prompts, 200 resamples), as the scan runs it. Its rows, the
    outcome, and the batches it ran."""
    table = smollm2_scan.table
    data = "retrieval-en"
    return table[table.data == data], smollm2_scan.outcomes[data], smollm2_scan.inputs[data]


def test_smollm2_finds_needles_at_1000_tokens_and_its_retrieval_heads_carry_them(smollm2, needles_en):
    table, outcome, batches = needles_en
    lengths = [len(p.ids) for p in outcome.prompts]
    assert len(lengths) == 12 and min(lengths) >= 900 and max(lengths) <= 1000
    assert outcome.accuracy >= 0.9, outcome.cells
    retr = table[table.role == "retr"]
    assert len(retr) >= 2, table.sort_values("score").tail(5)
    # Fewer than 5% of heads, as Wu et al. report, and with real intervals.
    assert len(retr) < 0.05 * len(table)
    assert (retr.ci_low > retr.baseline).all()

    heads = top_heads(table, "retrieval", 5)
    effect = ablate_retrieval(smollm2, outcome.prompts, batches, heads, outcome, draws=1)
    random_accuracy = min(r.accuracy for r in effect.random)
    assert effect.ablated.accuracy <= outcome.accuracy - 0.5
    assert random_accuracy >= outcome.accuracy - 0.25
    assert effect.ablated.answer_loss > 5 * max(r.answer_loss for r in effect.random)


@pytest.fixture(scope="module")
def ioi_en(smollm2_scan):
    """The English IOI part of the shared SmolLM2 scan: ``ioi`` on the shipped ioi/en.yaml with
    S-inhibition path patching, as the scan runs it (200 resamples). Its rows, and the outcome."""
    table = smollm2_scan.table
    return table[table.data == "ioi-en"], smollm2_scan.outcomes["ioi-en"]


def test_smollm2_solves_ioi_with_name_movers_negative_name_movers_and_s_inhibition(smollm2, ioi_en):
    table, outcome = ioi_en
    assert outcome.n >= 150
    assert outcome.single_token_names == outcome.names  # the shipped English names are one token
    assert outcome.accuracy >= 0.9
    assert 3.0 < outcome.logit_diff < 8.0  # about 5.2 nats in the reference
    movers = table[table.role == "nm"]
    negative = table[table.role == "neg"]
    assert len(movers) >= 2 and len(negative) >= 1, table[table.role != ""]
    assert (movers.ci_low > 0).all() and (negative.ci_high < 0).all()
    # Name movers attend to IO more than to S, and sit late in the network.
    attention = table[table.relation == "attention"].pivot_table(
        index=["layer", "head"], columns="direction", values="score"
    )
    for row in movers.itertuples():
        at = attention.loc[(row.layer, row.head)]
        assert at.io > at.s1 + at.s2
    assert movers.layer.min() >= smollm2.layout.n_layers // 2
    # S-inhibition heads were found by path patching, in layers before the name movers.
    inhibition = table[table.role == "sinh"]
    assert len(inhibition) >= 1
    assert (inhibition.layer < movers.layer.max()).all()


def test_ablating_the_name_movers_is_reported_against_random_same_layer_heads(smollm2, smollm2_scan, ioi_en):
    _, outcome = ioi_en
    check = verify_ioi(smollm2, smollm2_scan, "ioi-en", draws=1)
    assert check is not None
    assert abs(check.clean - outcome.logit_diff) < 1e-3  # the clean run is the scored one
    assert check.ablated < check.clean  # removing the name movers costs logit difference
    assert {layer for layer, _ in check.random_heads[0]} <= {layer for layer, _ in check.heads}
