"""headscope sweep: resumable after SIGKILL, checksums, failures, the lock, and the Ray executor (slow:
each run is a worker process that loads a model)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()
TOY = Path(__file__).resolve().parents[1] / "toy" / "model"
FAST = ["--seq-len", "20", "--batch", "8", "--resamples", "200"]
# Runs long enough (about 2 s each on the toy) that the SIGKILL lands between the first result and
# the last; with FAST all three could finish inside one polling interval.
KILLABLE = ["--seq-len", "20", "--batch", "3000", "--resamples", "200"]


@pytest.fixture
def checkpoints(tmp_path):
    root = tmp_path / "toyrun"
    for step in (100, 200, 300):
        shutil.copytree(TOY, root / f"step-{step}")
    return root


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _summary(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("sweep:"))


def _done(store: Path) -> list[dict]:
    """The runs the store's manifest records as done (none while it does not exist yet)."""
    try:
        manifest = json.loads((store / "manifest.json").read_text())
    except (OSError, ValueError):
        return []
    return [entry for entry in manifest.get("runs", {}).values() if entry.get("status") == "done"]


def test_sigkill_then_rerun_computes_only_the_missing_runs(checkpoints, tmp_path):
    store = tmp_path / "store"
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen(
        [sys.executable, "-m", "headscope.cli", "sweep", str(checkpoints), "--out", str(store), *KILLABLE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not _done(store):
            assert child.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    # A run is in the store once the manifest records it (the result file is written just before;
    # a kill between the two leaves a file the rerun rightly recomputes).
    finished = {Path(entry["file"]).name: (store / entry["file"]).read_bytes() for entry in _done(store)}
    assert 1 <= len(finished) < 3
    assert (store / ".lock").exists()  # left behind by the killed driver: stale, taken over below

    result = invoke("sweep", checkpoints, "--out", store, *KILLABLE)
    assert result.exit_code == 0, result.stderr
    assert f"{3 - len(finished)} computed, {len(finished)} already in the store, 0 failed" in _summary(
        result.stdout
    )
    for name, data in finished.items():
        assert (store / "runs" / name).read_bytes() == data  # untouched
    assert not list(store.glob("**/*.tmp")) and not (store / ".lock").exists()

    # A flipped byte in one result file: that run alone is recomputed.
    victim = sorted((store / "runs").glob("*.json"))[1]
    data = bytearray(victim.read_bytes())
    data[10] ^= 0x01
    victim.write_bytes(bytes(data))
    result = invoke("sweep", checkpoints, "--out", store, *KILLABLE)
    assert result.exit_code == 0, result.stderr
    assert "1 computed, 2 already in the store, 0 failed" in _summary(result.stdout)
    manifest = json.loads((store / "manifest.json").read_text())
    assert all(entry["status"] == "done" for entry in manifest["runs"].values())
    rows = list(csv.DictReader(io.StringIO((store / "sweep.csv").read_text())))
    assert {r["step"] for r in rows} == {"100", "200", "300"}
    assert {"model", "step", "layer", "head", "score", "ci_low", "ci_high", "role"} <= set(rows[0])


def test_a_model_that_fails_is_recorded_and_the_sweep_goes_on(tmp_path):
    store = tmp_path / "store"
    result = invoke("sweep", TOY, tmp_path / "no-such-model", "--out", store, *FAST)
    assert result.exit_code == 1
    assert "1 computed, 0 already in the store, 1 failed" in _summary(result.stdout)
    manifest = json.loads((store / "manifest.json").read_text())
    failed = [e for e in manifest["runs"].values() if e["status"] == "failed"]
    assert len(failed) == 1 and "no-such-model" in failed[0]["error"] and "\n" not in failed[0]["error"]
    assert "failed: " in result.stdout and "Traceback" not in result.stdout + result.stderr
    # The finished run of the store becomes an HTML report, heatmaps from the model it names.
    page = tmp_path / "report.html"
    result = invoke("report", store, "--html", page)
    assert result.exit_code == 0, result.stderr
    text = page.read_text()
    start = text.index('<script id="headscope-data" type="application/json">')
    embedded = json.loads(text[text.index(">", start) + 1 : text.index("</script>", start)])
    assert embedded["model"]["layers"] == 2 and len(embedded["heads"]) == 8
    assert len(embedded["examples"]) == 3 and embedded["tables"]


def test_two_sweeps_on_one_store_are_refused(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (store / ".lock").write_text(f"{holder.pid} {socket.gethostname()}")
        result = invoke("sweep", TOY, "--out", store, *FAST)
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "another sweep is writing there" in result.stderr


def test_ray_executor_without_ray_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    result = invoke("sweep", TOY, "--out", tmp_path / "store", "--executor", "ray")
    assert result.exit_code == 2
    assert 'pip install "headscope[ray]"' in result.stderr.replace("\n", " ")
