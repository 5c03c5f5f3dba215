"""The sweep's store: one result file per (target, analysis), and ``manifest.json``.

* Result files are JSON, written atomically (temporary file, then rename) by the driver alone,
  and never rewritten once valid, so a rerun leaves finished files byte-identical.
* The manifest records each run's spec, step, weights fingerprint, headscope version, options,
  status (done / failed) and the SHA-256 of its result file. A run is done when its entry says so,
  its options and fingerprint match, and its file's checksum matches; anything else is run again.
* ``.lock`` keeps two sweeps from writing one store. A lock whose process is gone (a driver killed
  with SIGKILL) is stale and taken over.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headscope import __version__
from headscope.errors import InputError

MANIFEST = "manifest.json"
LOCK = ".lock"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` for the duration; refuse (InputError) while another live sweep holds it."""
    path = folder / LOCK
    me = f"{os.getpid()} {socket.gethostname()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid_text, _, host = path.read_text().partition(" ")
                pid = int(pid_text)
            except (OSError, ValueError):
                pid, host = -1, ""
            if pid > 0 and host.strip() == socket.gethostname() and not _alive(pid):
                path.unlink(missing_ok=True)  # stale: its sweep died without cleaning up
                continue
            raise InputError(
                f"--out {folder}: another sweep is writing there (lock {path} held by process {pid_text})",
                hint="wait for it to finish, or delete the lock file if that process is gone",
            ) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(me)
        break
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            if path.read_text() == me:
                path.unlink()


class Store:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.results = folder / "runs"
        self.manifest_path = folder / MANIFEST
        self.runs: dict[str, dict[str, Any]] = {}

    def open(self) -> None:
        """Read the manifest (under the lock); remove temporary files a killed driver left."""
        self.results.mkdir(parents=True, exist_ok=True)
        for stale in [*self.folder.glob(".*.tmp"), *self.results.glob(".*.tmp")]:
            stale.unlink(missing_ok=True)
        if self.manifest_path.exists():
            try:
                data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
                self.runs = dict(data.get("runs", {}))
            except (OSError, ValueError, AttributeError):
                self.runs = {}  # a broken manifest: every run is checked again from scratch

    def save(self) -> None:
        data = {"headscope": __version__, "runs": self.runs}
        write_atomic(self.manifest_path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def file_of(self, run_key: str) -> Path:
        return self.results / f"{run_key}.json"

    def is_done(self, run_key: str, options: dict[str, Any], fingerprint: str) -> tuple[bool, str]:
        """(done, why not)."""
        entry = self.runs.get(run_key)
        if entry is None:
            return False, "new"
        if entry.get("status") != "done":
            return False, str(entry.get("status"))
        if entry.get("options") != options:
            return False, "options changed"
        if entry.get("fingerprint") != fingerprint:
            return False, "weights changed"
        path = self.file_of(run_key)
        if not path.exists():
            return False, "result file missing"
        if sha256(path) != entry.get("sha256"):
            return False, "checksum mismatch"
        return True, ""

    def record(self, run_key: str, entry: dict[str, Any], payload: dict[str, Any] | None) -> None:
        entry = dict(entry, headscope=__version__)
        if payload is not None:
            path = self.file_of(run_key)
            data = (json.dumps(payload, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
            write_atomic(path, data)
            entry.update(
                status="done",
                file=str(path.relative_to(self.folder)),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        self.runs[run_key] = entry
        self.save()

    def load(self, run_key: str) -> dict[str, Any]:
        return json.loads(self.file_of(run_key).read_text(encoding="utf-8"))
