"""`headscope icl` (and every ranged option) at the edges, from the command line (issue 39): exit 2,
one line naming the flag, no traceback, before any forward pass."""

from __future__ import annotations

import random

import pytest
import typer
from typer.testing import CliRunner

from headscope.cli import app

runner = CliRunner()
SCORE = ("--context", 60, "--early", 10, "--late", 40, "--window", 3, "--resamples", 0)


def invoke(*args):
    done = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})
    return done, " ".join(done.output.split())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("icl-cli-edges")
    rng = random.Random(2)
    texts = []
    for _ in range(5):
        symbols = [f"t{rng.randrange(60)}" for _ in range(30)]
        texts.append(" ".join(symbols + symbols))
    texts[3] = "t4 t5"
    (d / "texts.txt").write_text("\n\n".join(texts), encoding="utf-8")
    lines = ["name: twelve", "lang: en", "pairs:"] + [f"  - [t{i}, t{30 + i}]" for i in range(12)]
    (d / "twelve.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--text", "{d}"), "--text {d}: a folder, not a text file"),
        (("--tasks", "{d}/twelve.yaml", "--shots", "0,15"), "--shots 0,15: task 'twelve' has 12 pairs"),
        (("--tasks", "{d}/twelve.yaml", "--shots", "0", "--fv-shots", "50"), "--fv-shots 50: task 'twelve'"),
        (("--tasks", "{d}/twelve.yaml", "--shots", "0", "--fv-prompts", "12"), "--fv-prompts 12: task"),
        (
            ("--tasks", "none", "--context", "8"),
            "--context 8 leaves no late token to compare with --early 10",
        ),
        (("--min-accuracy", "nan"), "--min-accuracy': nan: must be a finite number"),
        (("--min-accuracy", "-inf"), "--min-accuracy': -inf: must be a finite number"),
        (("--min-accuracy", "1.5"), "--min-accuracy': 1.5: must be at most 1"),
        (("--min-accuracy", "high"), "--min-accuracy': high: expected a number"),
        (("--context", "1.5"), "--context': 1.5: expected a whole number"),
    ],
)
def test_icl_edges_are_refused_in_one_line(toy_dir, files, args, message):
    args = [a.format(d=files) if isinstance(a, str) else a for a in args]
    done, output = invoke("icl", toy_dir, "--text", files / "texts.txt", *SCORE, *args)
    assert done.exit_code == 2, done.output
    assert message.format(d=files) in output
    assert "Traceback" not in done.output and "ICL score" not in output


def _commands(command, path=()):
    subcommands = getattr(command, "commands", None)
    if subcommands:
        for name, sub in subcommands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, command


def test_every_ranged_option_refuses_nan_and_inf_in_words():
    """typer checks min and max itself, before our callback: "nan" got "Input should be less than
    or equal to 1". Every option with a range now says what is wrong with the value."""
    checked = 0
    for path, command in _commands(typer.main.get_command(app)):
        for param in command.params:
            if getattr(param, "min", None) is None and getattr(param, "max", None) is None:
                continue
            for value in ("nan", "inf"):
                done, output = invoke(*path, param.opts[0], value)
                assert done.exit_code == 2, (path, param.opts, value, done.output)
                assert any(
                    said in output
                    for said in ("must be a finite number", "expected a whole number", "valid integer")
                ), (path, param.opts, value, output)
                assert "Input should be less than" not in output and "greater than or equal" not in output
                checked += 1
    assert checked > 50


def test_a_short_paragraph_left_out_is_said(toy_dir, files):
    done, output = invoke("icl", toy_dir, "--text", files / "texts.txt", *SCORE, "--tasks", "none")
    assert done.exit_code == 0, done.output
    assert "1 of 5 text(s) left out of the ICL score: shorter than 43 tokens" in output
    assert "over 4 texts" in output


def test_show_profile_prints_the_cost_ledger_as_scan_does(toy_dir):
    done, output = invoke("show", toy_dir, "--text", "t1 t2 t3 t1 t2 t3", "--profile")
    assert done.exit_code == 0, done.output
    assert "profile: load" in output
    assert "× bare, 1 passes) · output" in output and "profile note:" in output


def _report_command(path):
    import json
    import re

    page = path.read_text(encoding="utf-8")
    data = re.search(r'<script id="headscope-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(data.group(1))["command"]


def test_the_html_report_records_the_headscope_command_not_the_host_programs_argv(
    toy_dir, tmp_path, monkeypatch
):
    # The CLI run in-process (a test runner, a notebook): sys.argv is the host program's.
    monkeypatch.setattr("sys.argv", ["pytest", "-q", "tests/elsewhere.py"])
    page = tmp_path / "r.html"
    done, _ = invoke("scan", toy_dir, "--resamples", 0, "--seq-len", 8, "--html", page)
    assert done.exit_code == 0, done.output
    assert _report_command(page) == f"headscope scan {toy_dir} --resamples 0 --seq-len 8 --html {page}"


def test_a_report_made_from_python_records_the_python_call(toy_dir, tmp_path, monkeypatch):
    import headscope as hs

    monkeypatch.setattr("sys.argv", ["pytest", "-q", "tests/elsewhere.py"])
    result = hs.scan(str(toy_dir), resamples=0, seq_len=8)
    page = result.to_html(tmp_path / "r.html", examples=False)
    assert _report_command(page) == "hs.scan('model', resamples=0, seq_len=8)"
    saved = hs.Result.from_json(result.to_dict())
    assert _report_command(saved.to_html(tmp_path / "s.html", examples=False)).startswith(
        "hs.Result.from_json(…) (a saved scan result of model)"
    )


@pytest.mark.parametrize(("given", "parsed"), [("none", None), ("None", None), ("0", 0), ("3", 3)])
def test_kv_plan_needles_none_reads_as_its_help_says(monkeypatch, given, parsed):
    """--needles: "0 or none: all". "none" was refused as not an integer."""
    from headscope.analyses import kvplan
    from headscope.errors import InputError

    def stop(_self, options):
        raise InputError(f"reached the check with needles={options.needles!r}")

    monkeypatch.setattr(kvplan.KVPlanAnalysis, "check", stop)
    done, output = invoke("kv-plan", "no-such-model", "--needles", given)
    assert f"reached the check with needles={parsed!r}" in output, output


def test_kv_plan_text_that_is_a_folder_is_named(tmp_path):
    done, output = invoke("kv-plan", "no-such-model", "--text", tmp_path)
    assert done.exit_code == 2, done.output
    assert f"--text {tmp_path}: a folder, not a text file" in output
