"""show, info, compare and --format as a user meets them, on the toy and the bundled models."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from headscope.cli import app
from headscope.verdicts.results import CSV_COLUMNS

runner = CliRunner()
# A bound for a hung child, not a pace: a cold interpreter importing torch on two busy cores
# can take minutes.
SUBPROCESS_TIMEOUT_S = 600


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def symbols(toy_texts, n: int = 24) -> str:
    return " ".join(toy_texts.read_text().split()[:n])


def test_show_finds_the_toy_previous_token_head(toy_dir, toy_texts, toy_truth):
    layer, head = toy_truth["previous_token_head"]
    result = invoke(
        "show", toy_dir, "--layer", layer, "--head", head, "--text", symbols(toy_texts), "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    n = len(data["labels"])
    weights = {(r["query"], r["key"]): r["weight"] for r in data["rows"]}
    argmax = [max(range(n), key=lambda k, q=q: weights[(q, k)]) for q in range(1, n)]
    hits = sum(best == q - 1 for q, best in enumerate(argmax, start=1))
    assert hits / (n - 1) > 0.8
    for q in range(n):  # causal rows sum to 1 and never look ahead
        assert sum(weights[(q, k)] for k in range(n)) == pytest.approx(1.0, abs=1e-4)
        assert all(weights[(q, k)] == 0 for k in range(q + 1, n))


def test_show_terminal_heatmap_and_grid(toy_dir, toy_texts):
    text = symbols(toy_texts, 10)
    one = invoke("show", toy_dir, "--layer", 0, "--head", 1, "--text", text)
    assert one.exit_code == 0, one.stderr
    lines = one.stdout.splitlines()
    assert lines[0] == "layer 0 head 1"
    rows = [line for line in lines if "→" in line]
    assert len(rows) == 10 and rows[1].lstrip().startswith("1 t")
    assert "\x1b[" not in one.stdout  # not a TTY: plain text
    grid = invoke("show", toy_dir, "--layer", 1, "--head", "all", "--text", text)
    assert grid.exit_code == 0
    assert all(f"H{h}" in grid.stdout for h in range(4)) and "4 heads, 10 tokens" in grid.stdout


def test_show_window_and_png(toy_dir, toy_texts, tmp_path):
    png = tmp_path / "map.png"
    result = invoke(
        "show",
        toy_dir,
        "--layer",
        1,
        "--head",
        "0,2",
        "--text",
        symbols(toy_texts, 30),
        "--max-tokens",
        12,
        "--start",
        5,
        "--png",
        png,
    )
    assert result.exit_code == 0, result.stderr
    assert "showing tokens 5–16 of 30" in result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert oct(png.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    again = invoke("show", toy_dir, "--text", "t1 t2", "--png", png)
    assert again.exit_code == 2 and "add --force" in again.stderr


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@pytest.mark.slow
def test_show_words_and_cjk_png_warning(smollm2, tmp_path):
    text = "我|喜欢|这幅|画|，|因为|它|很|美|。"
    png = tmp_path / "zh.png"
    result = invoke(
        "show",
        "smollm2-135m",
        "--layer",
        3,
        "--head",
        1,
        "--text",
        text,
        "--words",
        "--word-sep",
        "|",
        "--png",
        png,
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["unit"] == "word" and data["labels"] == [
        "我",
        "喜欢",
        "这幅",
        "画",
        "，",
        "因为",
        "它",
        "很",
        "美",
        "。",
    ]
    assert png.exists()
    from headscope.outputs.views import font_for

    if font_for(["喜欢"])[0] is None:
        assert "no installed font has the glyphs" in result.stderr
    else:
        assert "warning" not in result.stderr


@pytest.mark.slow
def test_info_on_both_bundled_models():
    gqa = invoke("info", "smollm2-135m", "--format", "json")
    assert gqa.exit_code == 0, gqa.stderr
    info = json.loads(gqa.stdout)
    assert (info["layers"], info["query_heads"], info["kv_heads"], info["head_dim"], info["d_model"]) == (
        30,
        9,
        3,
        64,
        576,
    )
    assert (
        info["kv_groups"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and info["attention"] == "grouped-query (GQA)"
    )
    assert info["context"] == 8192 and 130e6 < info["parameters"] < 140e6
    # Every decomposition is checked on the model itself and reproduces it.
    assert {view: found["ok"] for view, found in info["checks"].items()} == {
        "maps": True,
        "dla": True,
        "ov": True,
    }
    assert max(found["error"] for found in info["checks"].values()) < 1e-3
    table = invoke("info", "minilm-l6")
    assert table.exit_code == 0
    for needle in (
        "multi-head (MHA)",
        "12 per layer (72 in all)",
        "384 (= 12 × 32)",
        "512 tokens",
        "BertModel",
        "check: maps    ok",
        "check: dla     refused: the model has no LM head",
    ):
        assert needle in table.stdout


def test_format_csv_to_stdout_is_pipeable(toy_dir):
    result = invoke("induction", toy_dir, "--seq-len", 20, "--batch", 4, "--format", "csv", "-o", "-")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(rows[0]) == CSV_COLUMNS and len(rows) == 16
    assert "model:" in result.stderr and "model:" not in result.stdout


def test_format_json_and_output_file(toy_dir, tmp_path):
    target = tmp_path / "ind.json"
    result = invoke("induction", toy_dir, "--seq-len", 20, "--batch", 4, "--format", "json", "-o", target)
    assert result.exit_code == 0 and result.stdout == ""
    data = json.loads(target.read_text())
    assert data["command"] == "induction" and len(data["rows"]) == 16
    assert data["copy_loss"]["first"] > data["copy_loss"]["later"]
    assert {s["detector"] for s in data["sections"]} == {"induction", "duplicate-token"}
    table = tmp_path / "ind.txt"
    assert invoke("induction", toy_dir, "--seq-len", 20, "--batch", 4, "-o", table).exit_code == 0
    assert "next-token loss by copy" in table.read_text() and "\x1b[" not in table.read_text()
    refused = invoke("induction", toy_dir, "--seq-len", 20, "--batch", 4, "-o", table)
    assert refused.exit_code == 2 and "file exists" in refused.stderr
    forced = invoke(
        "induction", toy_dir, "--seq-len", 20, "--batch", 4, "-o", table, "--force", "--format", "csv"
    )
    assert forced.exit_code == 0 and table.read_text().startswith("model,detector")


def test_same_file_for_two_outputs_is_rejected(toy_dir, tmp_path):
    target = tmp_path / "x.csv"
    result = invoke("induction", toy_dir, "--csv", target, "-o", target)
    assert result.exit_code == 2 and "both write" in result.stderr


def test_compare_two_toy_scans(toy_dir, toy_texts, tmp_path):
    a, b, joined = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "joined.csv"
    base = [
        "scan",
        toy_dir,
        "--text",
        toy_texts,
        "--detectors",
        "previous-token,induction",
        "--resamples",
        200,
    ]
    assert invoke(*base, "--csv", a).exit_code == 0
    # B: the same model with a different threshold, so some roles disappear.
    assert invoke(*base, "--csv", b, "--role-threshold", 0.9).exit_code == 0
    result = invoke("compare", a, b, "--csv", joined)
    assert result.exit_code == 0, result.stderr
    assert "L0H1" in result.stdout and "disappeared" in result.stdout
    rows = list(csv.DictReader(io.StringIO(joined.read_text())))
    assert all(float(r["delta"]) == 0 for r in rows)  # same model: scores unchanged
    lost = {(r["detector"], r["layer"], r["head"]) for r in rows if r["change"] == "lost"}
    assert lost and all(r["role_a"] and not r["role_b"] for r in rows if r["change"] == "lost")
    as_json = json.loads(invoke("compare", a, b, "--format", "json").stdout)
    assert sum(len(t["lost"]) for t in as_json["tables"]) == len(lost)


NO_COLOR_CHILD = """
import contextlib, io, json, os, sys
toy, runs = sys.argv[1], {}
for name, env in (
    ("colored", {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"}),
    ("plain", {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}),
    ("piped", {}),
):
    for key in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        os.environ.pop(key, None)
    os.environ.update(env)
    # The CLI reads the environment when it is imported, as a fresh process would.
    for module in [m for m in sys.modules if m == "headscope" or m.startswith("headscope.")]:
        del sys.modules[module]
    from headscope.cli import main
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["headscope", "induction", toy, "--seq-len", "10", "--batch", "2"]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
    runs[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(runs))
"""


def test_no_color_and_pipes_give_plain_text(toy_dir):
    """Forced colour colours; NO_COLOR and a pipe give plain text. One process (torch is imported
    once), with the CLI imported afresh under each environment."""
    env = {k: v for k, v in os.environ.items() if k not in {"FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"}}
    proc = subprocess.run(
        [sys.executable, "-c", NO_COLOR_CHILD, str(toy_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(proc.stdout.splitlines()[-1])
    code, out, _ = runs["colored"]
    assert code == 0 and "\x1b[" in out  # forced colour does colour
    for name in ("plain", "piped"):
        code, out, err = runs[name]
        assert code == 0 and "induction" in out and "\x1b[" not in out + err, (name, err)


def test_show_csv_is_long_form(toy_dir):
    result = invoke("show", toy_dir, "--layer", 1, "--head", "0,3", "--text", "t1 t2 t3", "--format", "csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(rows[0]) == ["layer", "head", "unit", "query", "query_label", "key", "key_label", "weight"]
    assert len(rows) == 2 * 3 * 3 and {r["head"] for r in rows} == {"0", "3"}
    assert rows[1]["query_label"] == "t1" and rows[1]["key_label"] == "t2" and float(rows[1]["weight"]) == 0.0
