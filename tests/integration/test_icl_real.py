"""headscope icl on the bundled SmolLM2 (slow): one run, small but real, read by several tests.

The ICL score on the shipped haystacks is negative with an interval that excludes 0 (later tokens
are predicted better), few-shot prompts beat zero-shot ones, function-vector heads are scored by
patching, and --verify's table (induction / FV / random heads, mean-ablated) is complete.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import headscope as hs

pytestmark = pytest.mark.slow

OPTIONS = dict(
    context=96,
    early=10,
    late=88,
    window=3,
    tasks="antonym-en,plural-en",
    shots="0,5",
    queries=8,
    fv_prompts=3,
    k=3,
    draws=1,
    resamples=200,
    verify=True,
)


@pytest.fixture(scope="module")
def result(smollm2, tmp_path_factory):
    # The first paragraphs of the shipped English and Chinese haystacks, about 1,500 tokens (15
    # windows of 96): the suite's budget (docs/analyses/icl.md runs the whole haystacks). Measured on
    # 2026-12-05: the score is -0.96 [-1.31, -0.53] here; on twice the text (30 windows), which costs
    # twice the time in each of the four text passes (clean, and --verify's three), it was
    # -0.64 [-1.08, -0.25] on 2026-12-04, and -0.75 [-1.09, -0.48] on four times the text.
    from headscope.data.prompts import configs_dir

    texts = [
        (configs_dir() / f"retrieval/haystack-{lang}.txt").read_text(encoding="utf-8")
        for lang in ("en", "zh")
    ]
    path = tmp_path_factory.mktemp("icl") / "texts.txt"
    path.write_text(
        texts[0][:1500].replace("\n\n", "\n") + "\n\n" + texts[1][:625].replace("\n\n", "\n"),
        encoding="utf-8",
    )
    return hs.icl(smollm2, text=path, **OPTIONS)


def test_the_icl_score_is_negative_and_its_interval_excludes_zero(result):
    score = result.state["measures"].score
    assert (score.early, score.late, score.window) == (10, 88, 3)
    assert score.score.n >= 12  # windows of 96 tokens
    assert score.score.mean < 0 and score.score.ci[1] < 0, score.score
    assert result.report.measures["icl_score"] == pytest.approx(score.score.mean)


def test_few_shot_prompts_beat_zero_shot_ones(result):
    accuracy = {(a.task, a.shots): a.accuracy for a in result.state["measures"].accuracy}
    assert set(accuracy) == {(t, s) for t in ("antonym-en", "plural-en", "all") for s in (0, 5)}
    assert accuracy[("all", 5)].mean > accuracy[("all", 0)].mean + 0.3
    assert accuracy[("all", 5)].n == 16


def test_function_vector_heads_are_scored_and_transferred(result):
    table = result.report.table
    fv = table[table.detector == "fv"]
    assert len(fv) == 30 * 9 and (fv.n == 6).all()  # 3 corrupted prompts x 2 tasks
    assert fv.score.max() > 0.01
    assert set(fv.role) <= {"", "fv"}
    transfer = result.state["measures"].transfer
    assert transfer is not None and len(transfer.sweep) == 30 and len(transfer.heads) == 3
    assert 0 <= transfer.layer < 30


def test_the_ablation_table_compares_induction_fv_and_random_heads(result):
    (check,) = [c.value for c in result.checks if c.kind == "icl-ablation"]
    induction, fv = set(check.heads["induction"]), set(check.heads["fv"])
    assert len(induction) == len(fv) == 3 and not induction & fv
    assert not set(check.excluded) & (induction | fv)
    for measure in ("icl_score", "accuracy"):
        for name in ("induction", "fv", "random"):
            cell = check.cells[measure][name]
            assert np.isfinite(cell.value.mean) and cell.change.ci[0] <= cell.change.ci[1]
    data = json.loads(result.to_json())
    assert data["ablation"]["ablated"]["accuracy"]["fv"]["value"]["n"] == 16
    assert data["icl"]["icl_score"]["late"] == 88


def test_the_fv_role_reaches_the_html_report(result):
    page = result.html(examples=False)
    assert "function-vector head" in page  # the fv legend, from its RoleSpec
    assert "icl-tasks · fv · aie" in page
