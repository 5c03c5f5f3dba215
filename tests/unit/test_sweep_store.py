"""Sweep specs and the store's bookkeeping (fast: no model runs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headscope.errors import InputError
from headscope.sweeps.results import load_sweep_run
from headscope.sweeps.run import check_resources, prepare_folder
from headscope.sweeps.specs import expand, fingerprint
from headscope.sweeps.store import LOCK, MANIFEST, Store, locked

TOY = Path(__file__).resolve().parents[1] / "toy" / "model"


def _checkpoints(root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")
    return root


def test_checkpoint_folders_are_ordered_by_the_number_in_their_names(tmp_path):
    root = _checkpoints(tmp_path / "run", ["step-10", "step-2", "step-100", "final-1000"])
    targets = expand([str(root)])
    assert [t.step for t in targets] == [2, 10, 100, 1000]
    assert [t.label for t in targets] == ["run/step-2", "run/step-10", "run/step-100", "run/final-1000"]
    assert {t.series for t in targets} == {"run"}
    assert len({t.key for t in targets}) == 4


def test_hub_revisions_and_plain_specs(tmp_path):
    targets = expand(["org/model@step1000,step2000", "smollm2-135m"])
    assert [(t.spec, t.revision, t.step) for t in targets] == [
        ("org/model", "step1000", 1000),
        ("org/model", "step2000", 2000),
        ("smollm2-135m", None, None),
    ]


@pytest.mark.parametrize(
    ("names", "message"),
    [(["latest"], "has no number in its name"), ([], "holds no model")],
)
def test_bad_checkpoint_folders_are_refused(tmp_path, names, message):
    root = _checkpoints(tmp_path / "run", names)
    root.mkdir(exist_ok=True)
    with pytest.raises(InputError, match=message):
        expand([str(root)])


def test_the_same_model_twice_is_refused():
    with pytest.raises(InputError, match="given twice"):
        expand([str(TOY), str(TOY)])


def test_fingerprint_follows_the_weights(tmp_path):
    copy = tmp_path / "toy"
    shutil.copytree(TOY, copy)
    (target,) = expand([str(copy)])
    before = fingerprint(target)
    assert before == fingerprint(target)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert fingerprint(target) != before


def test_store_detects_a_changed_result_file(tmp_path):
    store = Store(tmp_path)
    store.open()
    entry = {"options": {"seed": 0}, "fingerprint": "f"}
    store.record("run", entry, {"rows": [1, 2, 3]})
    assert store.is_done("run", {"seed": 0}, "f") == (True, "")
    assert store.is_done("run", {"seed": 1}, "f") == (False, "options changed")
    assert store.is_done("run", {"seed": 0}, "g") == (False, "weights changed")
    path = store.file_of("run")
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01
    path.write_bytes(bytes(data))
    reopened = Store(tmp_path)
    reopened.open()
    assert reopened.is_done("run", {"seed": 0}, "f") == (False, "checksum mismatch")
    assert not list(tmp_path.glob("**/*.tmp"))


def test_a_live_lock_refuses_and_a_stale_one_is_taken_over(tmp_path):
    import socket

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(f"{sleeper.pid} {socket.gethostname()}")
        with pytest.raises(InputError, match="another sweep is writing there"), locked(tmp_path):
            pass
    finally:
        sleeper.kill()
        sleeper.wait()
    # The holder is gone (as after SIGKILL): the lock is stale and taken over, then released.
    with locked(tmp_path):
        assert (tmp_path / LOCK).read_text().startswith(str(os.getpid()))
    assert not (tmp_path / LOCK).exists()


# --- hostile stores (issue 23): each refusal is one InputError line naming the file and the cure -----


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def test_a_lock_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / LOCK).mkdir()
    with pytest.raises(InputError, match=r"\.lock is a folder, not a lock file") as caught, locked(tmp_path):
        pass
    assert "remove that folder" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "what"), [("", "is empty"), ("garbage", "names no process"), ("-5 h", "no process")]
)
def test_an_old_lock_that_names_no_process_is_stale_and_taken_over_with_a_note(tmp_path, text, what):
    (tmp_path / LOCK).write_text(text)
    _age(tmp_path / LOCK, 60)
    notes: list[str] = []
    with locked(tmp_path, notes.append):
        assert (tmp_path / LOCK).read_text().startswith(str(os.getpid()))
    assert len(notes) == 1 and "took over the stale lock" in notes[0] and what in notes[0]
    assert not (tmp_path / LOCK).exists()


def test_a_young_empty_lock_may_be_a_sweep_starting_and_is_refused(tmp_path):
    (tmp_path / LOCK).write_text("")
    with pytest.raises(InputError, match="another sweep is starting there") as caught, locked(tmp_path):
        pass
    assert "held by process )" not in str(caught.value)
    assert (tmp_path / LOCK).exists()


def test_a_dead_process_lock_is_taken_over_with_a_note(tmp_path):
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / LOCK).write_text(f"{gone.pid} {socket.gethostname()}")
    notes: list[str] = []
    with locked(tmp_path, notes.append):
        pass
    assert notes == [f"--out {tmp_path}: took over the stale lock of process {gone.pid}, which is gone"]


def test_a_live_lock_on_another_host_names_the_host(tmp_path):
    (tmp_path / LOCK).write_text("1 some-other-host")
    with pytest.raises(InputError, match="held by process 1 on 'some-other-host'"), locked(tmp_path):
        pass


def test_an_unreadable_lock_is_refused(tmp_path, monkeypatch):
    (tmp_path / LOCK).write_text("123 h")
    real = Path.read_text

    def denied(self, *args, **kwargs):
        if self.name == LOCK:
            raise PermissionError(13, "Permission denied")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(InputError, match=r"cannot be read \(Permission denied\)"), locked(tmp_path):
        pass


def _store_with_one_run(folder: Path) -> Store:
    store = Store(folder)
    store.open()
    entry = {"analysis": "induction", "label": "toy", "options": {"seed": 0}, "fingerprint": "f"}
    store.record("toy-1__induction", entry, {"rows": [{"layer": 0, "head": 0}], "layers": 1, "heads": 1})
    return store


def test_manifests_carry_a_schema_version_and_old_ones_read_as_version_1(tmp_path):
    _store_with_one_run(tmp_path)
    data = json.loads((tmp_path / MANIFEST).read_text())
    assert data["schema"] == "headscope-sweep/1"
    del data["schema"]
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    reopened = Store(tmp_path)
    reopened.open()
    assert reopened.is_done("toy-1__induction", {"seed": 0}, "f") == (True, "")
    assert reopened.notes == []


def test_unknown_keys_are_read_with_a_note(tmp_path):
    _store_with_one_run(tmp_path)
    data = json.loads((tmp_path / MANIFEST).read_text())
    data["future"] = 1
    data["runs"]["toy-1__induction"]["colour"] = "red"
    (tmp_path / MANIFEST).write_text(json.dumps(data))
    reopened = Store(tmp_path)
    reopened.open()
    assert reopened.is_done("toy-1__induction", {"seed": 0}, "f") == (True, "")
    assert len(reopened.notes) == 1
    assert "unknown keys ignored: future, runs.toy-1__induction.colour" in reopened.notes[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"runs": {"a": ', r"manifest.json:1: not valid JSON .*; truncated\?"),
        ("", r"manifest.json:1: not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8 text"),
        ('{"schema": "headscope-sweep/2", "runs": {}}', "is newer than this headscope reads"),
        ("[" * 100000, "nested too deeply|not valid JSON"),
    ],
)
def test_a_broken_manifest_is_refused_not_silently_discarded(tmp_path, text, message):
    path = tmp_path / MANIFEST
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError, match=message) as caught:
        Store(tmp_path).open()
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
    assert path.read_bytes() == (text if isinstance(text, bytes) else text.encode())  # left for the user


def test_a_manifest_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / MANIFEST).mkdir()
    with pytest.raises(InputError, match="is a folder, not a sweep manifest"):
        Store(tmp_path).open()


def test_runs_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "runs").write_text("")
    with pytest.raises(InputError, match="cannot prepare"):
        Store(tmp_path).open()


def test_a_missing_result_file_is_called_missing(tmp_path):
    store = _store_with_one_run(tmp_path)
    store.file_of("toy-1__induction").unlink()
    assert store.is_done("toy-1__induction", {"seed": 0}, "f") == (False, "result file missing")
    with pytest.raises(InputError, match=r"runs/toy-1__induction.json is missing") as caught:
        load_sweep_run(tmp_path)
    assert "checksum" not in str(caught.value)
    store.file_of("toy-1__induction").mkdir()
    assert store.is_done("toy-1__induction", {"seed": 0}, "f") == (False, "result file is not a file")


def test_a_run_of_a_store_loads_and_a_changed_one_says_checksum(tmp_path):
    store = _store_with_one_run(tmp_path)
    assert load_sweep_run(tmp_path)["rows"] == [{"layer": 0, "head": 0}]
    store.file_of("toy-1__induction").write_text('{"rows": []}\n')
    with pytest.raises(InputError, match="does not match its checksum"):
        load_sweep_run(tmp_path)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"retries": -1}, "--retries must be a whole number from 0 to 100, got -1"),
        ({"retries": 1.5}, "--retries must be a whole number from 0 to 100, got 1.5"),
        ({"workers": 0}, "--workers must be a whole number from 1 to 1024, got 0"),
        ({"cpus_per_run": 0.0}, "--cpus-per-run must be a number above 0 to 4096, got 0"),
        ({"cpus_per_run": -2.0}, "--cpus-per-run must be a number above 0 to 4096, got -2"),
        ({"cpus_per_run": float("nan")}, "--cpus-per-run must be a number above 0 to 4096, got nan"),
        ({"gpus_per_run": -0.5}, "--gpus-per-run must be a number from 0 to 1024, got -0.5"),
        ({"gpus_per_run": float("inf")}, "--gpus-per-run must be a number from 0 to 1024, got inf"),
        ({"workers": True}, "--workers must be a whole number from 1 to 1024, got True"),
    ],
)
def test_resource_options_are_checked_not_clipped(values, message):
    with pytest.raises(InputError) as caught:
        check_resources(**values)
    assert str(caught.value) == message


def test_resource_options_in_range_pass():
    check_resources(workers=1, retries=0, cpus_per_run=0.5, gpus_per_run=0.0)


def test_store_folders_that_cannot_be_made_are_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file, not a folder"):
        prepare_folder(tmp_path / "file" / "store")
    with pytest.raises(InputError, match=r"--out .*: is a file"):
        prepare_folder(tmp_path / "file")
    with pytest.raises(InputError, match="name too long for the file system"):
        prepare_folder(tmp_path / ("x" * 300))
    assert prepare_folder(tmp_path / "a" / "b").is_dir()
