"""The CLI as a user meets it: exit codes, stdout versus stderr, CSV columns, clear errors."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope import detectors
from headscope.cli import app
from headscope.verdicts.results import CSV_COLUMNS

runner = CliRunner()
# A bound for a hung child, not a pace: a cold interpreter importing torch on two busy cores
# can take minutes.
SUBPROCESS_TIMEOUT_S = 600


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_clean_error(result, code: int, *needles: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_induction_on_toy_writes_csv(toy_dir, tmp_path):
    target = tmp_path / "ind.csv"
    result = invoke("induction", toy_dir, "--seq-len", 20, "--batch", 4, "--top", 3, "--csv", target)
    assert result.exit_code == 0, result.stderr
    # Tables go to stdout, messages to stderr.
    assert "induction" in result.stdout and "next-token loss by copy" in result.stdout
    assert "wrote 16 rows" in result.stderr and "wrote" not in result.stdout
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert list(rows[0].keys()) == CSV_COLUMNS
    assert len(rows) == 2 * 2 * 4  # two detectors x 2 layers x 4 heads
    assert {r["detector"] for r in rows} == {"induction", "duplicate-token"}
    assert all(r["relation"] == "" and r["direction"] == "" for r in rows)
    assert not list(tmp_path.glob(".*.tmp")), "temporary file left behind"


def test_scan_on_toy_with_text_set(toy_dir, toy_texts, tmp_path):
    target = tmp_path / "scan.csv"
    result = invoke("scan", toy_dir, "--text", toy_texts, "--csv", target, "--top", 2, "--resamples", 200)
    assert result.exit_code == 0, result.stderr
    # The detectors that read the natural text or the repeated tokens: one table each, a row per head.
    token_level = [
        n for n, c in detectors.REGISTRY.items() if c.default_source in {"text", "repeated-tokens"}
    ]
    for detector in token_level:
        assert detector in result.stdout
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    head_level = [r for r in rows if r["relation"] == ""]
    assert len(head_level) == len(token_level) * 8  # the toy's 2 layers x 4 heads
    assert {r["detector"] for r in head_level} == set(token_level)
    assert {r["data"] for r in rows} >= {"symbols", "repeated-tokens", "syntax-en", "coref-en"}
    # The toy's tokenizer reads Chinese as <unk> runs that swallow whole clauses: every arc and
    # every candidate shares a token with its partner, so the Chinese sets are left out, with a note.
    assert not {"syntax-zh", "coref-zh"} & {r["data"] for r in rows}
    assert "syntax/zh.conllu: not scored" in result.stderr and "coref/zh.yaml: not scored" in result.stderr
    best_prev = min((r for r in rows if r["detector"] == "previous-token"), key=lambda r: int(r["rank"]))
    assert (best_prev["layer"], best_prev["head"]) == ("0", "1")


def test_unknown_model():
    result = invoke("scan", "no-such-model")
    assert_clean_error(result, 2, "model 'no-such-model' not found", "smollm2-135m")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--seq-len", "0"], "--seq-len"),
        (["--repeat-seq", "1"], "--repeat-seq"),
        (["--batch", "0"], "--batch"),
    ],
)
def test_out_of_range_options(toy_dir, args, needle):
    result = invoke("induction", toy_dir, *args)
    assert_clean_error(result, 2, needle)


def test_sequence_longer_than_context(toy_dir):
    result = invoke("induction", toy_dir, "--seq-len", 100, "--repeat-seq", 2)
    assert_clean_error(result, 2, "201 tokens", "context of 128 tokens")


@pytest.mark.parametrize("kind", ["missing-folder", "directory", "unwritable"])
def test_unwritable_csv_fails_before_running(toy_dir, tmp_path, kind):
    if kind == "missing-folder":
        target, needle = tmp_path / "nope" / "x.csv", "does not exist"
    elif kind == "directory":
        target, needle = tmp_path, "is a directory"
    else:
        if not Path("/proc").is_dir():
            pytest.skip("needs /proc, a folder nobody can create files in")
        target, needle = Path("/proc/headscope.csv"), "cannot write"
    result = invoke("induction", toy_dir, "--csv", target)
    assert_clean_error(result, 2, "--csv", needle)
    assert "loading" not in result.stdout


def test_bad_text_set_names_file_and_line(toy_dir, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("items:\n  - text: fine\n  - text: 3\n")
    result = invoke("scan", toy_dir, "--text", bad)
    assert_clean_error(result, 2, "bad.yaml:3", "'text' must be a non-empty string")


def test_unknown_detector(toy_dir):
    result = invoke("scan", toy_dir, "--detectors", "induction,bogus")
    assert_clean_error(result, 2, "unknown detector bogus", "previous-token")


def test_debug_shows_traceback():
    result = invoke("scan", "no-such-model", "--debug")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr


def test_models_lists_aliases():
    result = invoke("models")
    assert result.exit_code == 0
    assert "smollm2-135m" in result.stdout and "minilm-l6" in result.stdout


def test_installed_entry_point_error_path(tmp_path):
    """The real console script: one line on stderr, exit 2, no traceback."""
    exe = shutil.which("headscope", path=str(Path(sys.executable).parent)) or shutil.which("headscope")
    if exe is None:
        pytest.fail("the headscope console script is not installed")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [exe, "induction", str(tmp_path / "missing.gguf")],
        capture_output=True,
        text=True,
        env=env,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().startswith("error: GGUF file not found")
    assert "Traceback" not in proc.stderr


def test_core_does_not_import_typer():
    core = "headscope.models, headscope.data.prompts, headscope.data.conllu, headscope.capture, headscope.detectors, headscope.verdicts.roles, headscope.analyses, headscope.outputs.report, headscope.outputs.views, headscope.outputs.compare"
    code = f"import sys, {core}; print('typer' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.stdout.strip() == "False", proc.stderr


def test_corrupt_gguf_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 7)
    result = invoke("scan", broken)
    assert_clean_error(result, 2, "cannot read GGUF file", "broken.gguf")
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_induction_ablation_json(toy_dir, tmp_path):
    target = tmp_path / "ablation.json"
    result = invoke(
        "induction", toy_dir, "--seq-len", 16, "--batch", 4, "--ablate", 1, "--draws", 2, "--json", target
    )
    assert result.exit_code == 0, result.stderr
    assert "top-1 induction" in result.stdout
    payload = json.loads(target.read_text())
    assert set(payload) >= {
        "clean_loss",
        "clean_loss_ci",
        "topk_loss",
        "topk_loss_ci",
        "random_loss",
        "random_loss_ci",
        "topk_heads",
        "random_heads",
    }
    assert len(payload["topk_heads"]) == 1 and len(payload["random_heads"]) == 2
    assert payload["topk_heads"][0][0] == 1  # the toy's induction heads are in layer 1


def test_json_without_ablate_is_rejected(toy_dir, tmp_path):
    result = invoke("induction", toy_dir, "--json", tmp_path / "x.json")
    assert_clean_error(result, 2, "--json writes the ablation result")


def test_scan_role_map_and_roles_csv(toy_dir, toy_texts, tmp_path):
    target = tmp_path / "roles.csv"
    result = invoke(
        "scan",
        toy_dir,
        "--text",
        toy_texts,
        "--detectors",
        "previous-token,induction",
        "--roles-csv",
        target,
        "--resamples",
        200,
    )
    assert result.exit_code == 0, result.stderr
    assert "role map" in result.stdout and "legend:" in result.stdout
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert len(rows) == 8
    roles = {(r["layer"], r["head"]): r["role"] for r in rows}
    assert roles[("0", "1")] == "prev"
    assert {roles[("1", str(h))] for h in range(4)} == {"ind"}


def test_scan_weights_find_the_copying_half_of_the_induction_heads(toy_dir, toy_texts, tmp_path):
    """The toy's induction heads (layer 1) were trained to copy the token after the match, so their OV
    circuits copy; the previous-token head's does not need to."""
    target = tmp_path / "scan.csv"
    result = invoke(
        "scan",
        toy_dir,
        "--text",
        toy_texts,
        "--detectors",
        "induction,weights",
        "--csv",
        target,
        "--resamples",
        200,
    )
    assert result.exit_code == 0, result.stderr
    rows = [r for r in csv.DictReader(io.StringIO(target.read_text())) if r["detector"] == "weights"]
    copying = {(r["layer"], r["head"]): r for r in rows if r["relation"] == "copying"}
    assert len(copying) == 8
    for head in range(4):
        row = copying[("1", str(head))]
        assert row["role"] == "copy" and float(row["ci_low"]) > float(row["baseline"]) + 0.3
    assert {r["relation"] for r in rows} >= {"copying", "suppression", "eigenvalue"}


def test_scan_verify_on_toy(toy_dir, toy_texts, toy_truth):
    result = invoke(
        "scan",
        toy_dir,
        "--text",
        toy_texts,
        "--detectors",
        "previous-token,induction",
        "--verify",
        "--verify-k",
        "4",
        "--resamples",
        200,
    )
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if "L1H0" in line or "L0H1" in line]
    assert len(rows) == 2, result.stdout
    # The toy's four layer-1 induction heads carry its copying: ablating them brings back much of
    # the gap between copying (train_toy.py measured the later-copy loss) and guessing among the
    # vocabulary (ln V nats), the same bar as the ground-truth ablation test.
    # (With 4 heads a layer, the "same layers" random control falls back to layer 0, which holds
    # the previous-token heads the circuit needs, so it is not a fair control on this model.)
    vocab = json.loads((toy_dir / "config.json").read_text())["vocab_size"]
    gap = math.log(vocab) - toy_truth["final_loss_second_copy"]
    induction = next(row for row in rows if "L1H0" in row)
    assert float(induction[-2]) > 0.4 * gap, (induction, gap)


def test_one_sequence_gives_scores_but_no_intervals_and_no_roles(toy_dir, tmp_path):
    """`induction --batch 1` used to give every head over the threshold a role with a zero-width CI."""
    scores_csv = tmp_path / "scores.csv"
    result = invoke("induction", toy_dir, "--batch", 1, "--seq-len", 20, "--csv", scores_csv)
    assert result.exit_code == 0, result.stderr
    assert "n/a" in result.stdout
    assert "1 example < 5: too few to test" in result.stderr
    rows = list(csv.DictReader(io.StringIO(scores_csv.read_text())))
    assert rows and all(r["ci_low"] == "" and r["ci_high"] == "" and r["role"] == "" for r in rows)
    assert max(float(r["score"]) for r in rows if r["detector"] == "induction") > 0.5  # scores stay


def test_resamples_below_the_floor_are_refused_before_loading(toy_dir):
    result = invoke("induction", toy_dir, "--resamples", 50)
    assert result.exit_code == 2
    assert "--resamples" in result.stderr and "at least 200" in result.stderr
    assert "Traceback" not in result.stderr and "layers" not in result.stderr


def test_scan_prints_parts_as_they_finish_and_profiles(toy_dir, toy_texts, tmp_path):
    """Printed part by part (stdout) or at the end (-o FILE), the text is the same; --profile
    names each step with its seconds on stderr."""
    args = ("scan", toy_dir, "--text", toy_texts, "--top", 2, "--resamples", 200)
    live = invoke(*args, "--profile")
    assert live.exit_code == 0, live.stderr
    target = tmp_path / "scan.txt"
    at_end = invoke(*args, "-o", target)
    assert at_end.exit_code == 0, at_end.stderr
    assert live.stdout.split() == target.read_text().split()  # the file is wider: captions wrap elsewhere
    (line,) = [line for line in live.stderr.splitlines() if line.startswith("profile: ")]
    steps = dict(re.findall(r"([\w/.,() -]+?) (\d+\.\d) s", line.removeprefix("profile: ")))
    assert {"load", "text", "repeated-tokens", "syntax/en.conllu", "weights", "roles", "total"} <= {
        k.strip(" ·") for k in steps
    }
    # Each step that ran forward passes is priced against a bare forward of the same tokens.
    assert re.search(r"text \d+\.\d s \(\d+\.\d\d× bare, \d+ passes\)", line), line
    assert "profile note: × bare" in live.stderr
    assert "profile:" not in at_end.stderr


def test_every_analysis_command_is_derived_from_the_registry():
    """Its help is the summary; its flags are its options, the shared groups it takes and the outputs
    it declares (before the model loads, an output whose option is missing is refused)."""
    import typer.main

    from headscope.extend.protocol import ANALYSES

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, analysis in ANALYSES.items():
        if not analysis.cli:
            assert name not in commands
            continue
        command = commands[name]
        assert command.help.startswith(analysis.summary)
        flags = {flag for param in command.params for flag in param.opts}
        assert {o.flag for o in analysis.outputs} <= flags
        assert ("--top" in flags) == analysis.takes_top
        assert ("--capture" in flags) == analysis.takes_capture
        assert {"--csv", "--format", "--device"} <= flags


def test_an_output_that_needs_an_option_is_refused_before_the_model_loads(tmp_path):
    result = invoke("induction", tmp_path / "no-such-model", "--json", tmp_path / "a.json")
    assert_clean_error(result, 2, "--json writes the ablation result (add --ablate K)")
    assert not (tmp_path / "a.json").exists()
