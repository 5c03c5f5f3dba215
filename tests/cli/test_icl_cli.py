"""`headscope icl` from the command line, on the ground-truth toy: the ICL score of repeated symbols,
its JSON and PNG, and the refusals (exit 2, one line, before the first forward pass)."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from headscope.cli import app

runner = CliRunner()
SCORE = ("--tasks", "none", "--context", 60, "--early", 10, "--late", 40, "--window", 3, "--resamples", 200)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    rng = random.Random(1)
    texts = []
    for _ in range(8):
        symbols = [f"t{rng.randrange(60)}" for _ in range(30)]
        texts.append(" ".join(symbols + symbols))
    path = tmp_path_factory.mktemp("icl-cli") / "repeated.txt"
    path.write_text("\n\n".join(texts), encoding="utf-8")
    return path


def test_icl_on_repeated_symbols_writes_json_and_png(toy_dir, repeated, tmp_path):
    out, png = tmp_path / "icl.json", tmp_path / "loss.png"
    result = invoke("icl", toy_dir, "--text", repeated, *SCORE, "--png", png, "--format", "json", "-o", out)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    score = data["icl"]["icl_score"]
    assert (score["early"], score["late"], score["texts"]) == (10, 40, 8)
    assert score["score"] < -3.0 and score["ci"][1] < 0  # the toy copies the second half
    assert len(score["loss_by_position"]) == 60
    assert data["icl"]["accuracy"] == [] and "ablation" not in data  # None values are left out
    assert {row["detector"] for row in data["rows"]} == {"induction"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = invoke("icl", toy_dir, "--text", repeated, *SCORE, "--top", 2)
    assert shown.exit_code == 0
    assert "ICL score (loss at token 40 − loss at token 10, each ±3 tokens, over 8 texts)" in shown.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--early", 50, "--late", 40), "--late 40 must be after --early 50"),
        (("--tasks", "no-such-task"), "no-such-task"),
        (("--shots", "0,x"), "--shots 0,x"),
        (("--verify", "--no-fv"), "--verify compares induction with function-vector heads"),
        (("--text", "missing.txt"), "missing.txt"),
        (("--k", 0), "--k"),
    ],
)
def test_icl_refuses_bad_options_in_one_line(toy_dir, args, message):
    result = invoke("icl", toy_dir, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_tasks_whose_answers_the_tokenizer_cannot_spell_are_refused(toy_dir, repeated):
    # The toy's word-level vocabulary reads English as its unknown token: no answer is one token.
    result = invoke("icl", toy_dir, "--text", repeated, "--tasks", "antonym-en", "--k", 2)
    assert result.exit_code == 2, result.output
    assert "only 0 of" in result.output and "antonym-en.yaml" in result.output
