"""`headscope retrieval` and `headscope ioi` as a user runs them on the bundled SmolLM2:
JSON and CSV outputs that programs can read, the PNG, and the model-level numbers."""

from __future__ import annotations

import csv
import io
import json

import pytest
import yaml
from typer.testing import CliRunner

from headscope.cli import app
from headscope.data.circuits import load_ioi
from headscope.data.prompts import builtin
from headscope.verdicts.results import CSV_COLUMNS

pytestmark = pytest.mark.slow
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_retrieval_writes_json_csv_and_the_needle_heatmap(tmp_path):
    out, table, png = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    result = invoke(
        "retrieval",
        "--needles",
        5,
        "--context",
        300,
        "--depths",
        "0.5",
        "--format",
        "json",
        "-o",
        out,
        "--csv",
        table,
        "--png",
        png,
        "--resamples",
        200,
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["command"] == "retrieval"
    outcome = data["outcomes"]["retrieval-en"]
    assert outcome["n"] == 5 and outcome["accuracy"] >= 0.8
    assert outcome["cells"][0]["context"] == 300 and outcome["cells"][0]["mean_tokens"] <= 300
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert list(rows[0]) == CSV_COLUMNS and len(rows) == 30 * 9
    assert {r["detector"] for r in rows} == {"retrieval"}
    assert int(rows[0]["n"]) == outcome["counted_positions"]  # n is the counted answer positions
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ioi_on_a_small_set_reports_accuracy_and_heads(tmp_path):
    shipped = load_ioi(builtin("ioi/en.yaml"))
    items = [
        {"id": i.id, "text": i.text, "io": i.io, "s": i.s} for i in shipped.items[::8]
    ]  # 24 prompts from every template
    data = tmp_path / "small.yaml"
    data.write_text(yaml.safe_dump({"name": "small", "items": items}))
    out = tmp_path / "ioi.json"
    result = invoke("ioi", "--data", data, "--no-patch", "--format", "json", "-o", out, "--resamples", 200)
    assert result.exit_code == 0, result.stderr
    report = json.loads(out.read_text())
    outcome = report["outcomes"]["small"]
    assert outcome["n"] == 24 and outcome["accuracy"] >= 0.9 and outcome["logit_diff"] > 2
    relations = {(r["relation"], r["direction"]) for r in report["rows"]}
    assert relations == {("attention", "io"), ("attention", "s1"), ("attention", "s2"), ("dla", "io-s")}
    assert {r["role"] for r in report["rows"]} >= {"nm"}
