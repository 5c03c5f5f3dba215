"""Writing files safely: check a path before the model runs, then write it atomically.

A leaf module: it imports only the standard library and :mod:`headscope.errors`, so every layer
(outputs, sweep, the CLI) can use it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from headscope.errors import OutputError


def check_writable(path: str | Path, option: str = "--csv", force: bool = False) -> Path:
    """Fail before the model runs if ``path`` cannot be written.

    An existing file is kept unless ``force`` is set. Permission bits say little when running as
    root or on special file systems, so this creates and removes a scratch file in the target folder.
    """
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputError(f"{option} {path}: is a directory", hint="give a file name")
    parent = target.parent
    if not parent.is_dir():
        raise OutputError(f"{option} {path}: folder {parent} does not exist", hint="create it first")
    if target.exists() and not force:
        raise OutputError(f"{option} {path}: file exists", hint="add --force to overwrite it")
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(
            f"{option} {path}: cannot write in {parent} ({exc.strerror})",
            hint="choose a path you can write to",
        ) from exc
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"{option} {path}: file is read-only", hint="choose another path")
    return target


@contextlib.contextmanager
def atomic_path(path: str | Path, option: str = "--csv", force: bool = False) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto the target only on success.

    On any exception (Ctrl-C included) the temporary file is removed, so a reader never sees
    half a file and an interrupted run leaves nothing behind.
    """
    target = check_writable(path, option, force)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp makes the file private (0600); give it the mode a plain open() would have.
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{option} {path}: write failed ({exc.strerror})") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_atomic(path: str | Path, text: str, option: str = "--csv", force: bool = False) -> Path:
    """Write text to a temporary file in the same folder, then rename it onto ``path``."""
    with atomic_path(path, option, force) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="")
    return Path(path).expanduser()
