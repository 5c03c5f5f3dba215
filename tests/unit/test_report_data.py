"""The data the HTML report embeds, without a browser: schema, sizes, heatmaps, saved results."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from headscope import analyses
from headscope.errors import InputError
from headscope.extend.examples import MAX_EXAMPLE_TOKENS, attention_examples
from headscope.outputs import report
from headscope.outputs import report_data as data
from headscope.sweeps.results import load_result


@pytest.fixture(scope="module")
def toy_report(toy):
    result = analyses.scan(
        toy, detector_names=["previous-token", "induction"], n_resamples=200, include_weights=False
    )
    saved = report.jsonable(report.report_json(result, "scan", roles=report.roles_records(result)))
    return toy, result, saved


def test_report_data_has_every_head_and_table(toy_report):
    toy, result, saved = toy_report
    built = data.build(saved, layout=data.layout_of(toy), examples=attention_examples(toy))
    assert built["schema"] == data.SCHEMA
    assert built["model"]["layers"] == 2 and built["model"]["heads"] == 4 and built["model"]["kv_heads"] == 2
    assert len(built["heads"]) == 8
    assert {t["detector"] for t in built["tables"]} == {"previous-token", "induction"}
    assert all(len(t["rows"]) == 8 for t in built["tables"])
    by_head = {(h["layer"], h["head"]): h for h in built["heads"]}
    assert {by_head[(1, h)]["role"] for h in range(4)} == {"ind"}
    labels = [r["label"] for r in built["roles"]]
    assert "ind" in labels and all(r["color"].startswith("#") for r in built["roles"])
    json.dumps(built, allow_nan=False)  # no NaN reaches the page


def test_heatmaps_are_one_byte_per_weight_and_causal(toy_report):
    toy, _, _ = toy_report
    examples = attention_examples(toy)
    assert [e["name"] for e in examples] == ["English prose", "repeated random tokens", "Chinese sentence"]
    assert len(examples[1]["tokens"]) == 41  # BOS + 20 random symbols, twice
    for example in examples:
        n = len(example["tokens"])
        assert 1 <= n <= MAX_EXAMPLE_TOKENS
        assert len(example["maps"]) == 8
        grid = np.frombuffer(base64.b64decode(example["maps"]["1,0"]), dtype=np.uint8).reshape(n, n)
        assert (np.triu(grid, 1) == 0).all()  # causal: no query sees a later key
        assert np.allclose(grid.sum(1), 255, atol=n)  # each row is a distribution, up to rounding


def test_report_size_for_smollm2_shape_is_bounded():
    """270 heads x 3 examples of 64 tokens: the maps alone fit well under the 5 MB limit."""
    per_map = len(base64.b64encode(bytes(64 * 64)))
    assert 270 * 3 * per_map < 4_500_000


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"rows": []}', "not a headscope result"),
        (
            '{"headscope": "0.1", "command": "scan", "model": "m", "sections": [], "rows": [{"la',
            "not valid JSON",
        ),
        ("[1, 2]", "not a headscope result"),
    ],
)
def test_saved_results_that_are_not_headscopes_are_refused(tmp_path, content, message):
    path = tmp_path / "result.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        load_result(path)
