"""The sweep's store: one result file per (target, analysis), and ``manifest.json``.

* Result files are JSON, written atomically (temporary file, then rename) by the driver alone,
  and never rewritten once valid, so a rerun leaves finished files byte-identical.
* The manifest records each run's spec, step, weights fingerprint (an adapter's covers its base
  model's weights too), headscope version, options (every option the run read, given or default),
  the digests of the data files its options name (``inputs``), status (done / failed) and the
  SHA-256 of its result file. A run is done when its entry says so, its options, fingerprint and
  inputs match, and its file's checksum matches; anything else is run again, with a note.
* ``manifest.json`` follows :mod:`headscope.sweeps.schema`; a manifest that is not valid JSON or
  breaks the schema is refused (exit 2, naming the JSON path), never silently discarded.
* ``.lock`` keeps two sweeps from writing one store. It holds "PID HOST". A lock is stale, and taken
  over with a note, when its process is gone (a driver killed with SIGKILL), or when it names no
  process at all (empty or garbage: no live sweep wrote it) and is older than
  :data:`EMPTY_LOCK_GRACE` seconds (a sweep writes its lock right after creating it, so a younger
  empty lock may be one being born). A live or foreign-host lock, a lock that is a folder or cannot
  be read is refused with a line that says what to do.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from headscope import __version__
from headscope.errors import InputError, OutputError

from .schema import SCHEMA, check_manifest, elide

MANIFEST = "manifest.json"
LOCK = ".lock"
EMPTY_LOCK_GRACE = 5.0  # seconds: an empty or garbage lock younger than this may be a sweep starting
MAX_PID = 1 << 22  # Linux's pid_max ceiling; a larger number names no process


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


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "name too long for the file system"
    return exc.strerror or type(exc).__name__


def _parse_lock(text: str) -> tuple[int | None, str]:
    """(pid, host) of a lock's text; pid None when it names no process that could exist."""
    pid_text, _, host = text.strip().partition(" ")
    try:
        pid = int(pid_text)
    except ValueError:
        return None, host.strip()
    return (pid if 0 < pid <= MAX_PID else None), host.strip()


@contextlib.contextmanager
def locked(folder: Path, on_note: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``folder/.lock`` for the duration; refuse (InputError) while another live sweep holds it.
    The rules for a stale lock are in this module's docstring; taking one over is said in ``on_note``."""
    path = folder / LOCK
    me = f"{os.getpid()} {socket.gethostname()}"
    note = on_note or (lambda text: None)
    refuse_hint = "wait for it to finish, or delete the lock file if that process is gone"
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if path.is_dir():
                raise InputError(
                    f"--out {folder}: the lock {path} is a folder, not a lock file",
                    hint="remove that folder if no sweep is running there",
                ) from None
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
                age = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue  # released between our two looks: try again
            except OSError as exc:
                raise InputError(
                    f"--out {folder}: the lock {path} cannot be read ({_os_reason(exc)})",
                    hint="delete it if no sweep is running there",
                ) from None
            pid, host = _parse_lock(text)
            if pid is None:
                if age < EMPTY_LOCK_GRACE:
                    raise InputError(
                        f"--out {folder}: another sweep is starting there (lock {path} is being written)",
                        hint="try again in a few seconds",
                    ) from None
                what = "is empty" if not text.strip() else f"names no process ({elide(text.strip())})"
                path.unlink(missing_ok=True)
                note(f"--out {folder}: took over the stale lock {path}: it {what}")
                continue
            if host == socket.gethostname() and not _alive(pid):
                path.unlink(missing_ok=True)  # stale: its sweep died without cleaning up
                note(f"--out {folder}: took over the stale lock of process {pid}, which is gone")
                continue
            where = f" on {elide(host)}" if host and host != socket.gethostname() else ""
            raise InputError(
                f"--out {folder}: another sweep is writing there (lock {path} held by process {pid}{where})",
                hint=refuse_hint,
            ) from None
        except IsADirectoryError:
            raise InputError(
                f"--out {folder}: the lock {path} is a folder, not a lock file",
                hint="remove that folder if no sweep is running there",
            ) from None
        except OSError as exc:
            raise InputError(
                f"--out {folder}: cannot create the lock {path} ({_os_reason(exc)})",
                hint="choose a folder you can write to",
            ) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(me)
        break
    else:
        raise InputError(f"--out {folder}: cannot take the lock {path}", hint=refuse_hint)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if path.read_text() == me:
                path.unlink()


def read_manifest(path: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """A manifest's runs and notes, checked against the schema; InputError with one line otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; not a sweep manifest", hint=_HINT) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({_os_reason(exc)})", hint=_HINT) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); truncated?", hint=_HINT) from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply; not a sweep manifest", hint=_HINT) from None
    return check_manifest(data, path)


_HINT = "delete manifest.json to recompute every run, or use a new --out"


class Store:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.results = folder / "runs"
        self.manifest_path = folder / MANIFEST
        self.runs: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []  # what the reader noticed and the user should hear (unknown keys)

    def open(self) -> None:
        """Read the manifest (under the lock); remove temporary files a killed driver left."""
        try:
            self.results.mkdir(parents=True, exist_ok=True)
            for stale in [*self.folder.glob(".*.tmp"), *self.results.glob(".*.tmp")]:
                stale.unlink(missing_ok=True)
        except OSError as exc:
            raise InputError(
                f"--out {self.folder}: cannot prepare {self.results} ({_os_reason(exc)})",
                hint="give a folder you can write to, or a new --out",
            ) from None
        if self.manifest_path.is_dir():
            raise InputError(f"{self.manifest_path}: is a folder, not a sweep manifest", hint=_HINT)
        if self.manifest_path.exists():
            self.runs, self.notes = read_manifest(self.manifest_path)

    def save(self) -> None:
        self._write(self.manifest_path, self._manifest(self.runs))

    def _manifest(self, runs: dict[str, dict[str, Any]]) -> bytes:
        data = {"schema": SCHEMA, "headscope": __version__, "runs": runs}
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")

    def _write(self, path: Path, data: bytes) -> None:
        try:
            write_atomic(path, data)
        except OSError as exc:
            raise OutputError(f"--out {self.folder}: cannot write {path} ({_os_reason(exc)})") from None

    def file_of(self, run_key: str) -> Path:
        return self.results / f"{run_key}.json"

    def is_done(
        self,
        run_key: str,
        options: dict[str, Any],
        fingerprint: str,
        inputs: dict[str, str] | None = None,
    ) -> tuple[bool, str]:
        """(done, why not). ``inputs`` (the digests of the data files the options name) are compared
        when given."""
        entry = self.runs.get(run_key)
        if entry is None:
            return False, "new"
        if entry.get("status") != "done":
            return False, str(entry.get("status"))
        if entry.get("options") != options:
            return False, "options changed"
        if entry.get("fingerprint") != fingerprint:
            return False, "weights changed"
        if inputs is not None and (entry.get("inputs") or {}) != inputs:
            return False, "data changed"
        path = self.file_of(run_key)
        if not path.exists():
            return False, "result file missing"
        if not path.is_file():
            return False, "result file is not a file"
        try:
            digest = sha256(path)
        except OSError as exc:
            return False, f"result file unreadable ({_os_reason(exc)})"
        if digest != entry.get("sha256"):
            return False, "checksum mismatch"
        return True, ""

    def record(self, run_key: str, entry: dict[str, Any], payload: dict[str, Any] | None) -> None:
        """Write the run's result file, then the manifest that records it. Both are serialised first:
        a value JSON cannot hold (TypeError, ValueError) leaves nothing written."""
        entry = dict(entry, headscope=__version__)
        data = None
        if payload is not None:
            path = self.file_of(run_key)
            data = (json.dumps(payload, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
            entry.update(
                status="done",
                file=str(path.relative_to(self.folder)),
                sha256=hashlib.sha256(data).hexdigest(),
            )
        manifest = self._manifest({**self.runs, run_key: entry})
        if data is not None:
            self._write(self.file_of(run_key), data)
        self._write(self.manifest_path, manifest)
        self.runs[run_key] = entry

    def load(self, run_key: str) -> dict[str, Any]:
        return json.loads(self.file_of(run_key).read_text(encoding="utf-8"))
