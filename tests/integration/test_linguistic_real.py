"""Slow: syntax on the UD English EWT test treebank and coreference on the shipped sets."""

from __future__ import annotations

import pytest

from headscope import analysis
from headscope.prompts import builtin

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ewt(request):
    from pathlib import Path

    from headscope.conllu import read_conllu

    path = Path(request.config.rootpath).parent / "shared/data/ud/UD_English-EWT/en_ewt-ud-test.conllu"
    if not path.exists():
        pytest.skip("../shared/data/ud/UD_English-EWT is absent")
    return read_conllu(path, limit=600)


def best(report, relation, direction):
    table = report.table
    rows = table[(table.relation == relation) & (table.direction == direction)]
    top = rows[rows["rank"] == 1].iloc[0]
    return top, rows.iloc[0].baseline


@pytest.mark.parametrize(
    ("model", "obj_direction", "det_direction"),
    [("minilm", "dep->head", "dep->head"), ("smollm2", "dep->head", "head->dep")],
)
def test_obj_and_det_heads_beat_the_offset_baseline_on_ewt(request, ewt, model, obj_direction, det_direction):
    loaded = request.getfixturevalue(model)
    report = analysis.syntax(loaded, ewt, relations=["obj", "det", "nsubj"], n_resamples=200)
    for relation, direction in (("obj", obj_direction), ("det", det_direction)):
        top, baseline = best(report, relation, direction)
        print(
            model,
            relation,
            direction,
            f"L{top['layer']}H{top['head']}",
            round(top.score, 3),
            round(baseline, 3),
        )
        assert top.n >= 200
        assert top.score >= baseline + 0.15, (relation, top.score, baseline)
        assert top.ci_low > baseline
    if loaded.is_causal:
        # English det precedes its noun: the dependent cannot see its head in a causal model.
        assert not ((report.table.relation == "det") & (report.table.direction == "dep->head")).any()
        assert any("det dep->head" in note for note in report.notes)


@pytest.mark.parametrize("model", ["minilm", "smollm2"])
def test_coref_head_beats_nearest_candidate(request, model):
    loaded = request.getfixturevalue(model)
    report = analysis.coref(loaded, builtin("coref/en.yaml"), n_resamples=200)
    top = report.table[report.table["rank"] == 1].iloc[0]
    section = report.sections[0]
    print(model, f"L{top['layer']}H{top['head']}", round(top.score, 3), section.baseline, section.extras)
    assert top.ci_low > section.baseline
    assert top.score > section.extras["chance"] + 0.15
