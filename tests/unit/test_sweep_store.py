"""Sweep specs and the store's bookkeeping (fast: no model runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headscope.errors import InputError
from headscope.sweeps.specs import expand, fingerprint
from headscope.sweeps.store import LOCK, Store, locked

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
