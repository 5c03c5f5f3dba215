"""The Python API (``import headscope as hs``) on the toy model whose heads we built.

A model object is borrowed: its attention implementation, train/eval flags and weights are as they
were after an analysis, also when the analysis fails. An object and the same model loaded from its
folder give the same numbers. ``Result`` is checked against its own table, its JSON round trip
and the CLI's output.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import headscope as hs
from headscope.cli import app
from headscope.errors import InputError
from headscope.extend.protocol import ANALYSES, flag_of, get
from headscope.verdicts.results import CSV_COLUMNS
from headscope.verdicts.roles import ROLES_CSV_COLUMNS

FAST = {
    "detectors": "previous-token,duplicate-token,induction,sink",
    "resamples": 200,
    "seq_len": 20,
    "n_seqs": 8,
}


@pytest.fixture(scope="module")
def toy_object(toy_dir):
    """The toy, loaded by the user with transformers: SDPA attention, training mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(toy_dir, attn_implementation="sdpa")
    return model, AutoTokenizer.from_pretrained(toy_dir)


@pytest.fixture(scope="module")
def toy_result(toy_object, toy_texts):
    model, tokenizer = toy_object
    return hs.scan(model, tokenizer, text=toy_texts, **FAST)


def _state(model):
    return (
        model.config._attn_implementation,
        [m.training for m in model.modules()],
        {k: v.detach().clone() for k, v in model.state_dict().items()},
    )


def _assert_same_state(model, before):
    impl, modes, weights = before
    assert model.config._attn_implementation == impl
    assert [m.training for m in model.modules()] == modes
    after = model.state_dict()
    assert after.keys() == weights.keys()
    assert all(torch.equal(after[k], v) for k, v in weights.items())


def test_a_model_object_is_restored_after_the_analysis(toy_object, toy_texts):
    model, tokenizer = toy_object
    model.train()
    model.model.layers[0].eval()  # mixed flags: each module's own is restored, not just the top's
    before = _state(model)
    result = hs.scan(model, tokenizer, text=toy_texts, **FAST)
    assert len(result.table)
    _assert_same_state(model, before)
    result.verify(k=1)
    _assert_same_state(model, before)
    assert before[0] == "sdpa"


def test_a_model_object_is_restored_when_the_analysis_fails(toy_object, toy_texts):
    model, tokenizer = toy_object
    model.train()
    before = _state(model)
    seen = []

    def progress(label, total):
        def advance(n):
            seen.append(model.config._attn_implementation)  # switched while the analysis runs
            raise KeyboardInterrupt

        return advance

    with pytest.raises(KeyboardInterrupt):
        hs.scan(model, tokenizer, text=toy_texts, progress=progress, **FAST)
    assert seen == ["headscope_stream"]
    _assert_same_state(model, before)


def test_an_object_and_its_folder_give_the_same_numbers(toy_object, toy_dir, toy_texts, toy_result):
    from_folder = hs.scan(str(toy_dir), text=toy_texts, **FAST)
    a, b = toy_result.table, from_folder.table
    assert list(a.columns) == CSV_COLUMNS
    np.testing.assert_allclose(a.score.to_numpy(float), b.score.to_numpy(float), atol=1e-6)
    assert list(a.role) == list(b.role)


def test_load_refuses_what_it_cannot_use(toy_object):
    model, tokenizer = toy_object
    with pytest.raises(InputError, match="needs its tokenizer"):
        hs.load(model)
    with pytest.raises(InputError, match="for a model spec"):
        hs.load(model, tokenizer, device="cpu")
    with pytest.raises(InputError, match="tokenizer= goes with a model object"):
        hs.load("smollm2-135m", tokenizer)
    with pytest.raises(InputError, match="transformers PreTrainedModel"):
        hs.load(42)
    with pytest.raises(InputError, match="unknown option seq_length.*known:"):
        hs.scan(model, tokenizer, seq_length=3)


def test_load_keeps_a_loaded_model(toy):
    assert hs.load(toy) is toy


def test_scores_top_and_roles_agree_with_the_table(toy_result, toy_truth):
    table = toy_result.table
    scores = toy_result.scores("induction")
    assert scores.shape == (2, 4)
    rows = table[table.detector == "induction"]
    for row in rows.itertuples():
        assert scores[row.layer, row.head] == pytest.approx(row.score)
    top = toy_result.top("induction", 2)
    assert list(top.score) == sorted(rows.score, reverse=True)[:2]
    # The toy's best heads are layer-1 induction heads, as training built them (ground_truth.json).
    for row in top.itertuples():
        assert toy_truth["induction_scores"][f"L{row.layer}H{row.head}"] > 0.5
    roles = toy_result.roles
    assert list(roles.columns) == ROLES_CSV_COLUMNS and len(roles) == 8
    assert set(roles.role[roles.role != ""]) <= set(table.role[table.role != ""])


def test_scores_name_the_tables_to_choose_from(toy_result):
    with pytest.raises(InputError, match="no table for detector 'syntax'.*detectors: "):
        toy_result.scores("syntax")
    with pytest.raises(InputError, match="k=0 must be a whole number of heads, at least 1"):
        toy_result.top("induction", 0)
    with pytest.raises(InputError, match=r"k=1.5 must be a whole number"):  # not a pandas TypeError
        toy_result.top("induction", 1.5)
    with pytest.raises(InputError, match="detector=3 must be a table's name"):
        toy_result.scores(3)


def test_json_round_trip(toy_result, tmp_path):
    path = tmp_path / "result.json"
    text = toy_result.to_json(path)
    again = hs.Result.from_json(path)
    pd.testing.assert_frame_equal(again.table, toy_result.table, check_dtype=False)
    pd.testing.assert_frame_equal(again.roles, toy_result.roles, check_dtype=False)
    assert again.to_json() == text
    # The JSON keeps 10 decimals: an absolute 5e-11, more than 1e-9 of a score near 0.03.
    np.testing.assert_allclose(
        again.scores("induction"), toy_result.scores("induction"), rtol=1e-9, atol=1e-10
    )
    assert "from JSON" in repr(again)
    with pytest.raises(InputError, match="holds no model"):
        again.verify()
    with pytest.raises(InputError, match="not a headscope result"):
        hs.Result.from_json('{"rows": []}')


def test_csv_and_json_are_the_clis(toy_dir, toy_texts, toy_result, tmp_path):
    csv_path = tmp_path / "cli.csv"
    args = ["scan", str(toy_dir), "--text", str(toy_texts), "--csv", str(csv_path), "--format", "json"]
    for key, value in FAST.items():
        flag = flag_of(next(f for f in dataclasses.fields(get("scan").options) if f.name == key))
        args += [flag, str(value)]
    run = CliRunner().invoke(app, args)
    assert run.exit_code == 0, run.output
    assert csv_path.read_text() == toy_result.to_csv()
    cli_json = json.loads(run.stdout)
    assert cli_json["rows"] == json.loads(toy_result.to_json())["rows"]
    assert cli_json["roles"] == json.loads(toy_result.to_json())["roles"]


def test_the_report_shows_itself_offline(toy_result):
    page = toy_result._repr_html_()
    assert page.startswith("<iframe") and 'sandbox="allow-scripts"' in page
    document = toy_result.html()
    # Nothing is fetched: no script, stylesheet, image or font comes from anywhere but the page.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", document)
    assert "@import" not in document and "fetch(" not in document
    text = repr(toy_result)
    assert text.startswith("<headscope.Result scan of") and "2x4 heads" in text


def test_verify_keeps_its_checks(toy_result):
    checks = toy_result.verify(k=1)
    assert checks and toy_result.checks == checks
    record = checks[0].to_json()
    assert {"heads", "topk_effect", "random_effect"} <= set(record)
    saved = json.loads(toy_result.to_json())
    assert len(saved["verification"]) == len([c for c in checks if c.kind == "table"])


def test_induction_with_ablation(toy_object):
    model, tokenizer = toy_object
    result = hs.induction(model, tokenizer, seq_len=16, n_seqs=4, ablate=1, draws=1, resamples=200)
    assert [c.kind for c in result.checks] == ["induction"]
    assert json.loads(result.to_json())["ablation"]["k"] == 1


def test_show(toy_object):
    model, tokenizer = toy_object
    shown = hs.show(model, tokenizer, text="a b c a b c", layer=1, heads="all")
    weights = shown.weights
    assert weights.shape[0] == 4 and weights.shape[1] == weights.shape[2] == len(shown.labels)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)  # each query's attention is a distribution
    assert "<table" in shown._repr_html_() and "L1H0" in shown._repr_html_()
    assert len(shown.table) == 4 * len(shown.labels) ** 2


def test_every_analysis_is_one_function_with_the_clis_options():
    """The registry serves the API and the CLI: each option is one field, one flag, one help text.
    An analysis whose options are not command-line values (hs.detect's patterns) has no command."""
    runner = CliRunner()
    for name, analysis in ANALYSES.items():
        function = getattr(hs, name.replace("-", "_"))  # kv-plan: hs.kv_plan
        parameters = function.__signature__.parameters
        if not analysis.cli:
            assert runner.invoke(app, [name, "--help"]).exit_code == 2  # no such command
            assert all(parameters[f.name].default == f.default for f in dataclasses.fields(analysis.options))
            continue
        help_text = runner.invoke(
            app, [name if name != "weights" else "weights", "--help"], env={"COLUMNS": "200"}
        )
        assert help_text.exit_code == 0
        for field in dataclasses.fields(analysis.options):
            assert field.metadata["help"], f"{name}.{field.name} has no help text"
            assert parameters[field.name].default == field.default
            assert flag_of(field).split("/")[0] in help_text.stdout, f"{name}: {flag_of(field)}"


def test_every_public_name_survives_the_subpackages():
    """A subpackage named like an API function would shadow it once imported (hs.weights, hs.sweep)."""
    import importlib
    import pkgutil

    import headscope

    for module in pkgutil.walk_packages(headscope.__path__, "headscope."):
        if not module.name.startswith("headscope.cli"):
            importlib.import_module(module.name)
    for name in headscope.__all__:
        if name not in {"__version__", "Result", "HeadscopeError", "InputError"}:
            assert callable(getattr(hs, name)) and not isinstance(getattr(hs, name), type(headscope)), name


def test_option_values_are_checked_before_loading():
    for options, message in (
        ({"batch_size": 2.5}, "batch_size=2.5: expected int"),
        ({"seed": None}, "seed=None: expected int"),
        ({"weights": "no"}, "weights='no': expected bool"),
        ({"alpha": 2.0}, "alpha=2.0: must be at most 1"),
        ({"detectors": []}, "names no detector"),
        ({"detectors": "nope"}, "nope"),
    ):
        with pytest.raises(InputError, match=re.escape(message)):
            hs.scan("no-such-model-is-loaded", **options)
    with pytest.raises(InputError, match="capture must be one of"):
        hs.load("no-such-model", capture="bogus")
    with pytest.raises(InputError, match="chooses its own capture"):
        hs.ioi("no-such-model", capture="eager")
    # An empty --detectors means all of them, as on the command line.
    options, prepared = hs.plan("scan", detectors="")
    assert prepared.names is None


def test_a_loaded_model_keeps_its_settings(toy):
    with pytest.raises(InputError, match="already loaded"):
        hs.load(toy, capture="eager")
    with pytest.raises(InputError, match="already loaded"):
        hs.scan(toy, device="cpu", **FAST)


def test_verify_with_progress_bars_and_table_checks_in_json(toy_result):
    checks = toy_result.verify(k=1, progress=True)
    assert checks
    again = hs.Result.from_json(toy_result.to_json())
    assert len(again.checks) == len(checks)
    assert again.table.ci_low.dtype == float


def test_scan_hands_over_each_part_with_its_final_numbers(toy_dir, toy_texts):
    """A progress reporter with ``on_part`` gets each finished step of the scan at once (the CLI
    prints its tables then); its scores and intervals are the final ones, in the final order."""
    parts = []

    class Reporter:
        def __call__(self, label, total):
            return lambda n: None

        def on_part(self, report):
            parts.append(report)

    result = hs.scan(str(toy_dir), text=toy_texts, resamples=200, seq_len=20, n_seqs=8, progress=Reporter())
    assert {s.data for s in parts[0].sections} == {"symbols"}  # the natural-text part comes first
    assert [s for p in parts for s in p.sections] == result.report.sections
    columns = ["detector", "relation", "direction", "data", "layer", "head", "score", "ci_low", "ci_high"]
    handed = pd.concat([p.table for p in parts], ignore_index=True)[columns]
    pd.testing.assert_frame_equal(handed, result.table[columns])
    assert not any(p.table.role.astype(bool).any() for p in parts)  # roles are decided at the end
    steps = result.report.timings
    assert list(steps)[:3] == ["text", "repeated-tokens", "syntax/en.conllu"]
    assert steps.keys() >= {"weights", "roles"} and all(t >= 0 for t in steps.values())
