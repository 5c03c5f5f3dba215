"""headscope sweep: resumable after SIGKILL, checksums, failures, the lock, and the Ray executor (slow:
each run is a worker process that loads a model); and hostile inputs refused before the first run
(fast: no model loads)."""

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

runner = CliRunner()
TOY = Path(__file__).resolve().parents[1] / "toy" / "model"
FAST = ["--seq-len", "20", "--batch", "8", "--resamples", "200"]
# Runs long enough (about 1.5 s each on the toy) that the SIGKILL lands between the first result and
# the last; with FAST all three could finish inside one polling interval.
KILLABLE = ["--seq-len", "20", "--batch", "1000", "--resamples", "200"]


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_ray_executor_without_ray_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    result = invoke("sweep", TOY, "--out", tmp_path / "store", "--executor", "ray")
    assert result.exit_code == 2
    assert 'pip install "headscope[ray]"' in result.stderr.replace("\n", " ")


@pytest.mark.slow
def test_a_missing_result_file_is_named_and_recomputed_and_a_closed_stdout_ends_quietly(tmp_path):
    store = tmp_path / "store"
    assert invoke("sweep", TOY, "--out", store, *FAST).exit_code == 0
    (victim,) = (store / "runs").glob("*.json")
    victim.unlink()
    result = invoke("sweep", TOY, "--out", store, *FAST)
    assert result.exit_code == 0, result.stderr
    assert (
        f"note: run {victim.stem}: result file missing (runs/{victim.name}); computing it again"
        in result.stderr
    )
    assert "checksum" not in result.stderr and "1 computed, 0 already" in _summary(result.stdout)
    # `headscope sweep … | head -0`: stdout is a pipe nobody reads; the store is complete.
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run(
        [sys.executable, "-m", "headscope.cli", "sweep", str(TOY), "--out", str(store), *FAST],
        env=env,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    os.close(write_end)
    assert child.returncode == 141, child.stderr
    assert "error" not in child.stderr and "Traceback" not in child.stderr


# --- hostile inputs (issue 23): exit 2, one `error:` line naming the problem, before any run starts ---


def refused(result, *parts: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "unexpected" not in errors[0]
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def no_run_started(store: Path) -> None:
    assert not list(store.glob("runs/*.json")) if store.is_dir() else True
    assert not (store / "sweep.csv").exists() if store.is_dir() else True


def _file(folder: Path) -> Path:
    (folder / "file").write_text("")
    return folder / "file"


@pytest.mark.parametrize(
    ("make_out", "parts"),
    [
        (lambda d: _file(d) / "store", ["is a file, not a folder"]),
        (lambda d: _file(d) / "a" / "b", ["is a file, not a folder"]),
        (lambda d: _file(d), [": is a file", "(give a folder)"]),
        (lambda d: d / ("x" * 300), ["name too long for the file system", "(choose a shorter name)"]),
        (lambda d: d / ("y" * 300) / "store", ["name too long for the file system"]),
    ],
)
def test_store_paths_that_cannot_be_made(tmp_path, make_out, parts):
    out_dir = make_out(tmp_path)
    refused(invoke("sweep", TOY, "--out", out_dir, *FAST), "--out", *parts)


def test_a_lock_that_is_a_folder(tmp_path):
    (tmp_path / "store" / ".lock").mkdir(parents=True)
    refused(
        invoke("sweep", TOY, "--out", tmp_path / "store", *FAST), ".lock is a folder", "remove that folder"
    )
    no_run_started(tmp_path / "store")


def test_an_old_empty_lock_is_taken_over_with_a_note(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / ".lock").write_text("")
    old = time.time() - 600
    os.utime(store / ".lock", (old, old))
    (store / "manifest.json").write_text('{"runs": ')  # stops the sweep before any run: fast
    result = invoke("sweep", TOY, "--out", store, *FAST)
    assert (
        "note: --out" in result.stderr
        and "took over the stale lock" in result.stderr
        and "is empty" in result.stderr
    )
    refused(result, "manifest.json:1: not valid JSON", "truncated?", "delete manifest.json")
    assert not (store / ".lock").exists()  # released
    assert (store / "manifest.json").read_text() == '{"runs": '  # not silently discarded


def test_a_young_empty_lock_is_not_reported_as_held_by_process_nothing(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / ".lock").write_text("")
    line = refused(invoke("sweep", TOY, "--out", store, *FAST), "another sweep is starting there")
    assert "process )" not in line


MANIFEST_CASES = [
    (
        '{"runs": {"toy__induction": {"status": "done", "options": {}, "fingerprint": 12}}}',
        "runs.toy__induction.fingerprint: expected a string, got 12",
    ),
    ('{"runs": {"toy__induction": 7}}', "runs.toy__induction: expected an object, got 7"),
    (
        '{"runs": {"toy__induction": {"status": 1, "options": {}, "fingerprint": "f"}}}',
        "runs.toy__induction.status: expected a string, got 1",
    ),
    ('{"runs": []}', "runs: expected an object, got []"),
    ("[1, 2]", "expected a JSON object, got [1, 2]"),
    ('{"runs": {"../../x": {}}}', "not a run key"),
    ('{"runs": {"a": {"status": "done"', "not valid JSON"),
    ("", "not valid JSON"),
    ('{"schema": "headscope-sweep/9", "runs": {}}', "is newer than this headscope reads"),
]


@pytest.mark.parametrize(("text", "part"), MANIFEST_CASES)
def test_bad_manifests_name_the_json_path(tmp_path, text, part):
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(text)
    refused(invoke("sweep", TOY, "--out", store, *FAST), "manifest.json", part)
    no_run_started(store)
    assert (store / "manifest.json").read_text() == text and not (store / ".lock").exists()


def test_png_that_exists_is_refused_without_force_before_any_run(tmp_path):
    png = tmp_path / "plot.png"
    png.write_bytes(b"keep me")
    refused(
        invoke("sweep", TOY, "--out", tmp_path / "store", "--png", png, *FAST),
        f"--png {png}: file exists",
        "add --force to overwrite it",
    )
    assert png.read_bytes() == b"keep me" and not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--retries", "-1"], "--retries must be a whole number from 0 to 100, got -1"),
        (["--retries", "1000"], "--retries must be a whole number from 0 to 100, got 1000"),
        (["--cpus-per-run", "0"], "--cpus-per-run must be a number above 0 to 4096, got 0"),
        (["--cpus-per-run", "-1"], "--cpus-per-run must be a number above 0 to 4096, got -1"),
        (["--cpus-per-run", "nan"], "--cpus-per-run must be a number above 0 to 4096, got nan"),
        (["--gpus-per-run", "-1"], "--gpus-per-run must be a number from 0 to 1024, got -1"),
        (["--gpus-per-run", "inf"], "--gpus-per-run must be a number from 0 to 1024, got inf"),
        (["--workers", "0"], "--workers must be a whole number from 1 to 1024, got 0"),
        (["--workers", "-3"], "--workers must be a whole number from 1 to 1024, got -3"),
    ],
)
def test_resource_options_are_checked_before_the_store_is_touched(tmp_path, args, message):
    refused(invoke("sweep", TOY, "--out", tmp_path / "store", *args, *FAST), message)
    assert not (tmp_path / "store").exists()


class _Done:
    """A finished sweep's result, as far as sweep_cmd reads it."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.targets, self.computed, self.skipped = folder, [], [], []
        self.failed: dict[str, str] = {}
        self.table = None


@pytest.mark.parametrize("how", ["BrokenPipeError", "rich"])
def test_a_closed_stdout_ends_quietly_with_the_sigpipe_status(tmp_path, monkeypatch, how):
    from headscope.outputs.terminal import out

    monkeypatch.setattr(out, "quiet", False)  # restored after: on_broken_pipe silences the console

    def closed(result, n, console):
        if how == "rich":  # what the console does when its write meets a closed pipe
            console.on_broken_pipe()
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("headscope.sweeps.run.sweep", lambda *a, **k: _Done(tmp_path))
    monkeypatch.setattr("headscope.outputs.sweeps.print_sweep", closed)
    result = invoke("sweep", TOY, "--out", tmp_path / "store", *FAST)
    assert result.exit_code == 141 and result.stderr == ""


def test_notes_from_the_store_reach_stderr(tmp_path, monkeypatch):
    def fake(*args, on_note, **kwargs):
        on_note("manifest.json: unknown keys ignored: extra")
        return _Done(tmp_path)

    monkeypatch.setattr("headscope.sweeps.run.sweep", fake)
    monkeypatch.setattr("headscope.outputs.sweeps.print_sweep", lambda *a: None)
    result = invoke("sweep", TOY, "--out", tmp_path / "store", *FAST)
    assert result.exit_code == 0 and "note: manifest.json: unknown keys ignored: extra" in result.stderr
