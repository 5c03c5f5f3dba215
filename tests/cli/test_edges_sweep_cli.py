"""headscope sweep's edges from the command line (issue 39): --set takes exactly the options the named
analyses read in a sweep, a path option is stored as a string, and Ctrl-C while workers start ends
with one line and exit 130. Runs execute in this process (no worker processes) except for Ctrl-C."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope.cli import app

runner = CliRunner()
TOY = Path(__file__).resolve().parents[1] / "toy" / "model"
FAST = ["--seq-len", "10", "--batch", "2", "--resamples", "0"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def in_process(monkeypatch):
    from headscope.sweeps import run as sweep_run
    from headscope.sweeps.executors import run_task

    monkeypatch.setattr(
        sweep_run, "run_local", lambda tasks, workers, retries: ((t, run_task(t)) for t in tasks)
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "ablate=2"], "--set ablate=2: a sweep stores the tables of induction and never runs"),
        (["--analysis", "scan", "--set", "verify=true"], "so verify would change nothing"),
        (["--set", "seq_len=20", "--set", "seq_len=30"], "--set seq_len=30: seq_len is already set"),
        (["--seq-len", "20", "--set", "seq_len=30"], r"already set \(--seq-len 20\)"),
        (["--tokens", "300"], "--tokens 300: weights is not one of this sweep's analyses"),
        (
            ["--analysis", "weights", "--seq-len", "20"],
            "--seq-len 20: seq_len is an option of none of weights",
        ),
        (["--analysis", "weights,icl", "--set", "k=3"], "k means different things in weights and icl"),
        (["--set", "nope=1"], "nope is an option of none of induction"),
        (["--set", "seq_len="], "--set seq_len=: give seq_len a value"),
        # A value is checked as the analysis checks it, and said in the words typed (not "icl: early=0").
        (["--analysis", "icl", "--set", "early=0"], r"^error: --set early=0: must be at least 1$"),
        (["--analysis", "describe", "--set", "lang=fr"], r"^error: --set lang=fr: choose from en, zh"),
        (["--analysis", "icl", "--set", "seed=-1"], r"^error: --set seed=-1: a seed must be between"),
        (["--analysis", "icl", "--set", "tasks=,"], r"^error: --set tasks=,: names no task"),
        (["--analysis", "describe", "--set", "resamples=5"], r"^error: --set resamples=5: too few for a 95%"),
    ],
)
def test_set_takes_only_what_changes_the_run(tmp_path, args, message):
    store = tmp_path / "store"
    result = invoke("sweep", TOY, "--out", store, *args)
    assert result.exit_code == 2, result.output
    import re

    assert re.search(message, result.stderr), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not store.exists()  # refused before the store is touched


def test_set_detectors_changes_a_scan_sweep(tmp_path, in_process):
    store = tmp_path / "store"
    result = invoke("sweep", TOY, "--out", store, "--analysis", "scan", "--set", "detectors=induction", *FAST)
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader((store / "sweep.csv").open()))
    assert rows and {row["detector"] for row in rows} == {"induction"}


def test_the_docs_text_example_runs_and_stores_the_path_as_a_string(tmp_path, in_process):
    texts = tmp_path / "held.txt"
    texts.write_text("\n\n".join(" ".join(f"t{i % 50}" for i in range(s, s + 70)) for s in range(6)) + "\n")
    store = tmp_path / "store"
    icl = ["--set", "tasks=none", "--set", "context=60", "--set", "early=10", "--set", "late=40"]
    result = invoke("sweep", TOY, "--out", store, "--analysis", "icl", "--set", f"text={texts}", *icl)
    assert result.exit_code == 0, result.stderr
    (entry,) = json.loads((store / "manifest.json").read_text())["runs"].values()
    assert entry["status"] == "done" and entry["options"]["text"] == str(texts)
    assert not list(store.glob("**/*.tmp"))


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the workers")
def test_ctrl_c_while_workers_start_is_one_line_and_130(tmp_path):
    store = tmp_path / "store"
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, "-m", "headscope.cli", "sweep", TOY, "--out", store, "--workers", "2", *FAST],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the SIGINT below is a terminal's Ctrl-C
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_children(child.pid)) < 2:
            assert child.poll() is None, child.communicate()
            time.sleep(0.05)
        workers = _children(child.pid)
        time.sleep(0.5)  # the workers are importing torch
        os.killpg(child.pid, signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("interrupted: ") and "run the same sweep again" in lines[-1], stderr
    # No worker left running (multiprocessing's resource tracker ends by itself once the driver has).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(workers):
        time.sleep(0.1)
    assert not _alive(workers), [_cmdline(pid) for pid in _alive(workers)]
    assert not (store / ".lock").exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the workers")
def test_ctrl_c_after_a_run_keeps_it_and_says_so(tmp_path):
    import shutil

    steps = 8  # a toy run takes 0.2 s on a quiet machine: enough of them that the Ctrl-C lands mid-sweep
    for step in range(1, steps + 1):
        shutil.copytree(TOY, tmp_path / "run" / f"step-{step}")
    store = tmp_path / "store"
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=os.pathsep.join(sys.path))
    # The Ctrl-C lands after the first run, while a later one runs.
    heavy = ["--seq-len", "20", "--batch", "300", "--resamples", "0"]
    child = subprocess.Popen(
        [sys.executable, "-m", "headscope.cli", "sweep", tmp_path / "run", "--out", store, *heavy],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not list((store / "runs").glob("*.json")):
            assert child.poll() is None, child.communicate()
            time.sleep(0.05)
        time.sleep(0.2)  # the manifest records the run just after its file is written
        os.killpg(child.pid, signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "Warning" not in stderr, stderr  # no leaked-semaphore warning
    said = re.search(
        rf"interrupted: (\d+) finished runs? kept in the store {re.escape(str(store))}.*, (\d+) not run",
        stderr,
    )
    assert said is not None, stderr
    finished, not_run = int(said[1]), int(said[2])
    assert 1 <= finished < steps and finished + not_run == steps, stderr
    manifest = json.loads((store / "manifest.json").read_text())
    assert [entry["status"] for entry in manifest["runs"].values()] == ["done"] * finished
