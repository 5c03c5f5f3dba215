"""A pip-installed plugin, driven from the CLI: tests/plugins/headscope-brackets adds two detector
declarations and an analysis through entry points; tests/plugins/headscope-broken goes wrong in
every way a plugin can (import error, a built-in's name, not a declaration).

Each package is installed with pip into a folder of this test session (``--target``), which the
subprocesses put on PYTHONPATH: the test venv is the one pip installs into, but other tests running
beside this one (pytest-xdist) never see the plugins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TOY_DIR, TOY_TEXTS

PLUGINS = ROOT / "tests" / "plugins"


def install(package: str, target: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(PLUGINS / package),
        ],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    target = tmp_path_factory.mktemp("plugins")
    install("headscope-brackets", target)
    env = dict(os.environ, PYTHONPATH=str(target), COLUMNS="200")
    return env


@pytest.fixture(scope="module")
def broken_env(tmp_path_factory):
    target = tmp_path_factory.mktemp("broken")
    install("headscope-broken", target)
    return dict(os.environ, PYTHONPATH=str(target), COLUMNS="200")


def headscope(env, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("headscope")
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=600)


def test_plugin_detectors_run_in_the_scan_with_roles_and_csv(plugin_env, tmp_path):
    out = tmp_path / "scan.json"
    done = headscope(
        plugin_env,
        "scan",
        str(TOY_DIR),
        "--detectors",
        "previous-token,offset-2,offset-3",
        "--text",
        str(TOY_TEXTS),
        "--resamples",
        "200",
        "--format",
        "json",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    saved = json.loads(out.read_text())
    detectors = {row["detector"] for row in saved["rows"]}
    assert detectors == {"previous-token", "offset-2", "offset-3"}
    # Each plugin table has the uniform reference and intervals, as a built-in's has.
    rows = [r for r in saved["rows"] if r["detector"] == "offset-2"]
    assert len(rows) == 8 and all(
        r["baseline"] > 0 and r["ci_low"] <= r["score"] <= r["ci_high"] for r in rows
    )


def test_plugin_detectors_are_listed_with_their_package(plugin_env):
    done = headscope(plugin_env, "detectors")
    assert done.returncode == 0, done.stderr
    lines = {
        line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ") and line.split()
    }
    assert (
        "brkt" in lines["closing-bracket"] and "plugin headscope-brackets 0.1.0" in lines["closing-bracket"]
    )
    assert "plugin headscope-brackets 0.1.0" in lines["offset-2"] and "built-in" in lines["induction"]
    assert "plugin headscope-brackets 0.1.0" in lines["brackets"]


def test_plugin_analysis_is_a_command(plugin_env, tmp_path):
    listed = headscope(plugin_env, "--help")
    assert listed.returncode == 0 and "brackets" in listed.stdout
    helped = headscope(plugin_env, "brackets", "--help")
    assert helped.returncode == 0 and "--text" in helped.stdout and "--resamples" in helped.stdout
    out = tmp_path / "brackets.csv"
    done = headscope(
        plugin_env, "brackets", str(TOY_DIR), "--text", str(TOY_TEXTS), "--resamples", "0", "--csv", str(out)
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    # The plugin's analysis ran its detectors beside the built-in previous-token one; its
    # "offset-1" is previous-token under another name, so its offset-2 row exists and differs.
    assert "previous-token" in text and "offset-2" in text and "offset-3" in text
    bad = headscope(plugin_env, "brackets", str(TOY_DIR), "--batch-size", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_plugin_detector_from_python(plugin_env):
    code = (
        "import headscope as hs; from headscope.detectors import REGISTRY;"
        "print(REGISTRY.origin('closing-bracket')); print(hs.brackets.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=plugin_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plugin", "headscope-brackets", "0.1.0", "brackets"]


def test_a_broken_plugin_is_named_and_never_breaks_the_host(broken_env):
    done = headscope(broken_env, "--help")
    assert done.returncode == 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 4, done.stderr
    assert all("headscope-broken 0.0.1" in line for line in warnings)
    assert any("failed to import (ModuleNotFoundError" in line for line in warnings)
    assert any("'induction' collides with a built-in detector" in line for line in warnings)
    assert any("42 is not a detector" in line for line in warnings)
    assert any("'scan' collides with a built-in analysis" in line for line in warnings)
    assert "Traceback" not in done.stderr
    # The real commands still work, with the built-ins (not the plugin's fakes).
    ran = headscope(broken_env, "induction", str(TOY_DIR), "--resamples", "0", "--top", "1")
    assert ran.returncode == 0, ran.stderr
    assert "induction" in ran.stdout


def test_plugin_check_printer_html_section_and_writer_appear_as_a_builtins_do(plugin_env, tmp_path):
    """The plugin's analysis declares its own check type (it prints itself), an HTML section and a
    file writer: they reach the terminal, the HTML report, the JSON and the written file."""
    gap, page, saved = tmp_path / "gap.txt", tmp_path / "page.html", tmp_path / "result.json"
    common = [str(TOY_DIR), "--text", str(TOY_TEXTS), "--resamples", "0", "--verify"]
    done = headscope(plugin_env, "brackets", *common, "--gap", str(gap), "--html", str(page))
    assert done.returncode == 0, done.stderr
    # terminal: the check's own printer, not its JSON
    line = next(x for x in done.stdout.splitlines() if x.startswith("bracket gap"))
    assert " vs offset-" in line or " vs previous-token" in line
    assert '"gap"' not in done.stdout  # not printed as raw JSON
    # the written file: the plugin's own writer
    assert gap.read_text() == line.strip() + "\n"
    assert f"wrote {gap}" in done.stderr
    # the HTML report: the plugin's section, its style in the page's head
    html = page.read_text()
    assert html.count('<section id="bracket-gap"') == 1 and "Bracket gap" in html
    head, body = html.split("<body>", 1)
    assert ".bracket-gap {" in head and "<style>" not in body
    # the JSON: the check's record
    done = headscope(plugin_env, "brackets", *common, "--format", "json", "-o", str(saved))
    assert done.returncode == 0, done.stderr
    record = json.loads(saved.read_text())["verification"][0]
    assert f"vs {record['offset_detector']} L{record['offset_head'][0]}H{record['offset_head'][1]}" in line
    # a saved result draws the same section (headscope report)
    again = tmp_path / "again.html"
    done = headscope(plugin_env, "report", str(saved), "--html", str(again), "--no-examples")
    assert done.returncode == 0, done.stderr
    assert again.read_text().count('<section id="bracket-gap"') == 1
    # --gap without --verify is refused before the model loads
    bad = headscope(plugin_env, "brackets", str(TOY_DIR), "--gap", str(tmp_path / "x.txt"))
    assert bad.returncode == 2 and "--gap needs --verify" in bad.stderr
