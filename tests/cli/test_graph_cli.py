"""headscope graph from the command line: the edges CSV and the page written, bad options refused in
one line (exit 2) before the model loads or before any pass."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import TOY_DIR
from typer.testing import CliRunner

from headscope.analyses.graph import EDGE_COLUMNS
from headscope.cli import app

runner = CliRunner()


def test_the_command_writes_the_edges_and_the_page(tmp_path):
    edges, page = tmp_path / "edges.csv", tmp_path / "graph.html"
    result = runner.invoke(
        app,
        [
            "graph",
            str(TOY_DIR),
            "--repeat-seq",
            "2",
            "--seq-len",
            "12",
            "--windows",
            "5",
            "--resamples",
            "200",
        ]
        + ["--edges", str(edges), "--html", str(page), "--top", "2"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    assert "How heads compose" in result.stdout and "induction heads" in result.stdout
    table = pd.read_csv(edges)
    assert list(table.columns) == EDGE_COLUMNS and len(table) > 0
    assert set(table["side"]) <= {"query", "key", "value"} and (table["share"] >= 0.1).all()
    assert page.read_text(encoding="utf-8").count('<section id="graph"') == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--data", "configs/ioi/en.yaml", "--repeat-seq", "2"], "not both"),
        (["--threshold", "2"], "--threshold"),
        (["--heads", "L9H0"], "--heads: L9H0"),
        (["--verify", "1", "--heads", "L0H0"], "above layer 0"),
    ],
)
def test_bad_options_give_one_line(args, needle):
    result = runner.invoke(app, ["graph", str(TOY_DIR), *args], catch_exceptions=False)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert needle in result.stderr.replace("\n", " ")
