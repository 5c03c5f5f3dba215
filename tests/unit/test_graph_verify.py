"""graph's causal check on all three sides (:mod:`headscope.analyses.graph_verify`), on the toy with
layer 0's heads but L0H1 silenced (the planted K-composition of ``test_graph``):

* each induction head's top key source, L0H1, taken out of its key input alone moves its attention
  far more than random lower sources do; its top query and value sources are checked with the
  query-only and value-only edits, the value side as the relative change of what the head writes;
* the ratios land on the matching edges; heads without an edge are skipped and named; a count of
  heads beyond those above layer 0 is refused before any pass;
* on labelled windows (key weights given by hand: the induction target against the final token's
  earlier occurrence), the query and key sides report the change of the head's preference and the
  share of prompts whose preference flips; swapping answer and distractor negates the change.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import TOY_DIR
from rich.console import Console

from headscope.analyses.graph import FinalRow, Graph, GraphOptions, GraphResult, edges_of, graph
from headscope.analyses.graph_verify import mark_edges, verify_sides
from headscope.analyses.qk import explain
from headscope.errors import InputError
from headscope.extend.base import RepeatSpec, repeated_tokens
from headscope.models import load


@pytest.fixture(scope="module")
def planted():
    loaded = load(str(TOY_DIR))
    with torch.no_grad():
        weight = loaded.model.model.layers[0].self_attn.o_proj.weight
        for head in (0, 2, 3):
            weight[:, head * 16 : (head + 1) * 16] = 0
    return loaded


@pytest.fixture(scope="module")
def planted_graph(planted):
    options = GraphOptions(
        heads="L1H0,L1H1,L1H2,L1H3", repeat_seq=2, seq_len=20, windows=5, rows=0, resamples=200
    )
    _, found, state = graph(planted, options, Graph().check(options))
    return found, state


def _hooks(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]


def test_each_side_s_top_source_moves_the_head_more_than_random_sources(planted, planted_graph):
    found, state = planted_graph
    found = copy.deepcopy(found)
    hooks = _hooks(planted.model)
    checked = verify_sides(planted, found, state, 2, 5, 0, 200)
    assert _hooks(planted.model) == hooks
    assert not checked.contrast and checked.skipped == []
    heads = list(dict.fromkeys((r.layer, r.head) for r in checked.removals))
    assert len(heads) == 2 and all(layer == 1 for layer, _ in heads)
    for layer, head in heads:
        sides = {r.side: r for r in checked.removals if (r.layer, r.head) == (layer, head)}
        assert set(sides) == {"query", "key", "value"}
        key = sides["key"]
        assert key.source == "L0H1" and key.measure == "attention" and "L0H1" not in key.controls
        assert key.move > 0.5 and key.control_move < 0.05  # measured 0.83-0.85 against 0.005
        assert key.ratio > 20 and key.ci_low > 5  # measured 160-170 [120, 260]
        assert key.rows_read == 5 * 20 and "later copies" in key.rows
        value = sides["value"]
        assert value.measure == "output" and value.ratio is not None
        assert value.ratio > 2 and value.ci_low > 1  # measured 7.8 [7.4, 8.3]
        assert value.move > value.control_move > 0
        query = sides["query"]
        assert query.measure == "attention" and query.ratio is not None and query.ratio > 5
    mark_edges(found, checked)
    marked = {(e["layer"], e["head"], e["side"], e["source"]): e["verified_ratio"] for e in found.edges}
    for removal in checked.removals:
        assert marked[(removal.layer, removal.head, removal.side, removal.source)] == removal.ratio
    unverified = [e for e in found.edges if (e["layer"], e["head"]) not in heads]
    assert unverified and all(e["verified_ratio"] is None for e in unverified)
    text = json.dumps(checked.to_json())
    assert json.loads(text)["removals"][0]["side"] == "query"
    console = Console(record=True, width=160)
    checked.print_to(console, 0)
    printed = console.export_text()
    assert "L0H1" in printed and "total variation" in printed and "after its W_O slice" in printed


def test_heads_without_edges_are_skipped_and_a_count_above_the_heads_is_refused(planted, planted_graph):
    found, state = planted_graph
    thinned = copy.deepcopy(found)
    thinned.edges = [e for e in thinned.edges if (e["layer"], e["head"]) != (1, 3)]
    for n, message in [(0, "at least 1"), (5, "only 4 of the 4 heads in the graph lie above layer 0")]:
        with pytest.raises(InputError, match=message):
            verify_sides(planted, thinned, state, n, 2, 0, 0)
    checked = verify_sides(planted, thinned, state, 4, 1, 0, 0)
    assert {(r.layer, r.head) for r in checked.removals} == {(1, 0), (1, 1), (1, 2)}
    assert len(checked.skipped) == 1 and checked.skipped[0].startswith("L1H3: no edge")
    assert all(r.ci_low is None for r in checked.removals)  # no resamples: no interval


def _labelled(loaded, swap=False):
    """Repeated random tokens with hand-made key weights: at the final token, the answer is the
    position after its earlier occurrence (the induction target), the distractor that occurrence."""
    sequences, specials, _ = repeated_tokens(loaded, RepeatSpec(seq_len=20, repeats=2, n_seqs=12, seed=0))
    weights = []
    for ids in sequences:
        w = torch.zeros(len(ids), dtype=torch.float64)
        w[len(ids) - 20] += -1.0 if swap else 1.0
        w[len(ids) - 21] += 1.0 if swap else -1.0
        weights.append(w)
    return list(zip(sequences, specials, strict=True)), weights


def test_contrast_mode_reports_the_preference_s_change_and_flips(planted):
    pairs, weights = _labelled(planted)
    found, state = explain(
        planted,
        pairs[:6],
        pairs[6:],
        "hand-made",
        [(1, h) for h in range(4)],
        rows=None,
        n_resamples=200,
        repeated=True,
        value=True,
        contrast=(weights[:6], weights[6:]),
        sample=FinalRow(),
    )
    result = GraphResult(
        found.heads, edges_of(found.heads, 0.1, "contrast"), "hand", "contrast", 0.1, found.windows, {}
    )
    state["verify_rows"] = None
    checked = verify_sides(planted, result, state, 2, 4, 0, 200, contrast=weights[6:])
    assert checked.contrast
    keys = [r for r in checked.removals if r.side == "key"]
    queries = [r for r in checked.removals if r.side == "query"]
    values = [r for r in checked.removals if r.side == "value"]
    assert len(keys) == len(queries) == len(values) == 2
    for removal in keys + queries:
        assert removal.measure == "contrast" and removal.rows == "the final token" and removal.rows_read == 6
        assert removal.change < -0.3 and abs(removal.control_change) < 0.05  # measured -0.7..-0.9, < 0.01
        assert removal.move == pytest.approx(-removal.change)  # every prompt's preference fell
        assert 0 <= removal.flips <= 1 and removal.control_flips == 0
        assert removal.ratio > 10
    assert keys[0].source == "L0H1"
    assert max(r.flips for r in queries) > 0  # the queries without the embedding lose the target
    for removal in values:
        assert removal.measure == "output" and removal.change is None and removal.ratio > 2
    # answer and distractor swapped: the same removals (same seed), the change and nothing else negated
    pairs, swapped = _labelled(planted, swap=True)
    mirrored = verify_sides(planted, result, state, 2, 4, 0, 200, contrast=swapped[6:])
    for a, b in zip(checked.removals, mirrored.removals, strict=True):
        assert (a.side, a.source, a.controls) == (b.side, b.source, b.controls)
        if a.change is not None:
            assert b.change == pytest.approx(-a.change, abs=1e-9)
            assert b.flips == a.flips and b.move == pytest.approx(a.move, abs=1e-9)
    console = Console(record=True, width=200)
    checked.print_to(console, 1)
    printed = console.export_text()
    assert "flips" in printed and "and 1 more heads" in printed
    with pytest.raises(InputError, match="5 contrast weights for 6 evaluation windows"):
        verify_sides(planted, result, state, 1, 1, 0, 0, contrast=weights[7:])


def test_verify_is_refused_before_any_pass_where_it_cannot_run(planted):
    from tiny_models import tiny_gpt2

    from headscope.analyses.graph_verify import check_verify

    check_verify(planted, 4, [(1, h) for h in range(4)])
    check_verify(planted, 4, None)
    with pytest.raises(InputError, match=r"--verify 2: only 1 of the 2 heads asked for lie above layer 0"):
        check_verify(planted, 2, [(0, 1), (1, 0)])
    with pytest.raises(InputError, match="GPT2Attention\\) has no separate query, key and value projections"):
        check_verify(tiny_gpt2(), 1, None)
