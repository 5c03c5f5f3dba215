"""A regular install from the wheel: the prompt sets ship inside it and are found from there.

The rest of the suite may run on an editable install (``make`` keeps one for development), so
this test builds the wheel, installs it into a folder of its own and runs the console script
from there, on the toy model, with the shipped natural-text set.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_the_wheel_carries_the_configs_and_runs_from_them(tmp_path, toy_dir):
    wheels = tmp_path / "wheels"
    # hatchling comes with the dev extra: no build isolation, so nothing is fetched.
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        wheels,
        ROOT,
    )
    (wheel,) = wheels.glob("headscope-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*") if p.is_file()}
    assert {f"headscope/{name}" for name in shipped} <= names
    assert "headscope/py.typed" in names
    assert not any(name.startswith(("tests/", "src/", "docs/")) for name in names)

    site = tmp_path / "site"
    run(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel)
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    where = run(
        sys.executable,
        "-c",
        "import headscope, headscope.data.prompts as p; print(headscope.__file__); print(p.configs_dir())",
        env=env,
        cwd=tmp_path,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(site) and Path(where[1]) == site / "headscope" / "configs"

    script = site / "bin" / "headscope"
    scan = run(
        sys.executable,
        script,
        "scan",
        toy_dir,
        "--detectors",
        "previous-token",
        "--resamples",
        "200",
        "--top",
        "2",
        env=env,
        cwd=tmp_path,
    )
    assert "previous-token" in scan.stdout and "configs/text/natural.yaml" in scan.stdout
