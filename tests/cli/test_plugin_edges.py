"""tests/plugins/headscope-edgy, pip-installed and driven from the CLI (issue 39): a plugin role
label a built-in holds, a missing prompt set, a module that calls sys.exit while it imports and an
analysis named after a headscope command are each named in one warning and left out; targets that
raise stop the scan with the detector and its package named. Installed as tests/cli/test_plugins.py
installs its plugins: into a folder of this session, on the subprocesses' PYTHONPATH only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TOY_DIR, TOY_TEXTS


@pytest.fixture(scope="module")
def edgy_env(tmp_path_factory):
    target = tmp_path_factory.mktemp("edgy")
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
            str(ROOT / "tests" / "plugins" / "headscope-edgy"),
        ],
        check=True,
        capture_output=True,
    )
    return dict(os.environ, PYTHONPATH=str(target), COLUMNS="200")


def headscope(env, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("headscope")
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=600)


def test_each_edge_is_one_warning_and_the_rest_loads(edgy_env):
    done = headscope(edgy_env, "detectors")
    # Before: the plugin's sys.exit(3) ended the interpreter on the first read, printing nothing.
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 4, done.stderr
    assert all("headscope-edgy 0.0.2" in line for line in warnings)
    assert any("exits" in line and "failed to import (SystemExit: 3)" in line for line in warnings)
    assert any(
        "'ind-twin': its role label 'ind' is the label of detector 'induction'" in line for line in warnings
    )
    assert any(
        "'no-prompts': its prompt set" in line and "missing.txt does not exist" in line for line in warnings
    )
    assert any("analysis 'sweep'" in line and "`headscope sweep`" in line for line in warnings)
    assert "Traceback" not in done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert "divides" in listed and not {"ind-twin", "no-prompts"} & listed
    # The built-in sweep is still the command.
    helped = headscope(edgy_env, "sweep", "--help")
    assert helped.returncode == 0 and "--out" in helped.stdout


def test_targets_that_raise_name_the_detector_and_its_package(edgy_env):
    done = headscope(
        edgy_env, "scan", str(TOY_DIR), "--detectors", "divides", "--text", str(TOY_TEXTS), "--resamples", "0"
    )
    # Before: "error: unexpected ZeroDivisionError: division by zero", naming neither.
    assert done.returncode == 1, done.stderr
    assert "detector 'divides' (plugin headscope-edgy 0.0.2)" in done.stderr
    assert "ZeroDivisionError" in done.stderr and "unexpected" not in done.stderr
    assert "Traceback" not in done.stderr
