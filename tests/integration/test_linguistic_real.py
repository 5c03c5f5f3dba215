"""Slow: syntax on the UD English EWT test treebank and coreference on the shipped sets."""

from __future__ import annotations

import pytest
from conftest import require_shared

from headscope import analyses
from headscope.data.prompts import builtin

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ewt():
    from headscope.data.conllu import read_conllu

    return read_conllu(require_shared("ud/UD_English-EWT/en_ewt-ud-test.conllu"), limit=600)


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
    report = analyses.syntax(loaded, ewt, relations=["obj", "det", "nsubj"], n_resamples=200)
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


def coref_best(request, model, data):
    loaded = request.getfixturevalue(model)
    report = analyses.coref(loaded, builtin(f"coref/{data}.yaml"), n_resamples=200)
    top = report.table[report.table["rank"] == 1].iloc[0]
    section = report.sections[0]
    print(model, data, f"L{top['layer']}H{top['head']}", round(top.score, 3), round(top.ci_low, 3))
    print("  nearest", round(section.baseline, 3), {k: round(v, 3) for k, v in section.extras.items()})
    return report, top, section


@pytest.mark.parametrize("model", ["minilm", "smollm2"])
def test_coref_head_beats_every_reference(request, model):
    """English: the best head clears the nearest candidate, chance and the first candidate (the
    reference a sink-like head gets for free, which the role rule also uses)."""
    report, top, section = coref_best(request, model, "en")
    assert top.ci_low > section.baseline
    assert top.score > section.extras["chance"] + 0.15
    assert top.ci_low > section.extras["first candidate"]
    assert top.role == "coref"


def test_coref_smollm2_chinese_head_beats_every_reference(request):
    report, top, section = coref_best(request, "smollm2", "zh")
    assert top.ci_low > max(section.baseline, section.extras["chance"], section.extras["first candidate"])


def test_coref_minilm_finds_no_chinese_coreference_head(request):
    """Observed, not a goal: all-MiniLM-L6-v2 (an English sentence encoder) has no head whose
    interval clears the first-candidate reference on the Chinese set (best head about 0.55,
    interval from about 0.49, first candidate 0.51), so the role rule names no coref head."""
    report, top, section = coref_best(request, "minilm", "zh")
    first = section.extras["first candidate"]
    assert not (report.table.ci_low > first).any()
    assert (report.table.role != "coref").all()
