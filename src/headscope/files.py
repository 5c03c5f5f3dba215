"""Writing files safely: check a path before the model runs, then write it atomically.

A leaf module: it imports only the standard library and :mod:`headscope.errors`, so every layer
(outputs, sweep, the CLI) can use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from headscope.errors import OutputError, elide


def check_writable(path: str | Path, option: str = "--csv", force: bool = False) -> Path:
    """Fail before the model runs if ``path`` cannot be written.

    An existing file is kept unless ``force`` is set. Permission bits say little when running as
    root or on special file systems, so this creates and removes a scratch file in the target folder.
    Every refusal is an :class:`OutputError` naming the option and the path: a folder, a missing
    folder, a parent that is a file, a name too long for the file system.
    """
    shown = f"{option} {elide(str(path), 200)}"
    try:
        return _check_writable(Path(path).expanduser(), shown, force)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _too_long(shown) from exc
        raise OutputError(
            f"{shown}: cannot write there ({exc.strerror or exc})", hint="choose a path you can write to"
        ) from exc
    except ValueError as exc:  # an embedded NUL byte
        raise OutputError(f"{shown}: not a valid file name ({exc})") from exc


def _too_long(shown: str) -> OutputError:
    return OutputError(f"{shown}: file name too long for the file system", hint="choose a shorter name")


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _check_writable(target: Path, shown: str, force: bool) -> Path:
    if target.is_dir():
        raise OutputError(f"{shown}: is a directory", hint="give a file name")
    parent = target.parent
    if not parent.is_dir():
        ancestor = parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if ancestor.exists() and not ancestor.is_dir():
            raise OutputError(
                f"{shown}: {elide(str(ancestor), 200)} is a file, not a folder",
                hint="choose a path in a folder",
            )
        raise OutputError(f"{shown}: folder {elide(str(parent), 200)} does not exist", hint="create it first")
    if len(os.fsencode(target.name)) > _name_max(parent):
        raise _too_long(shown)
    if target.exists() and not force:
        raise OutputError(f"{shown}: file exists", hint="add --force to overwrite it")
    try:
        handle, probe = tempfile.mkstemp(prefix=_scratch_prefix(target), suffix=".probe", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(
            f"{shown}: cannot write in {elide(str(parent), 200)} ({exc.strerror})",
            hint="choose a path you can write to",
        ) from exc
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"{shown}: file is read-only", hint="choose another path")
    return target


def _scratch_prefix(target: Path) -> str:
    """A hidden scratch name next to the target, short enough for any file system's name limit."""
    return f".{target.name[:64]}."


@contextlib.contextmanager
def atomic_path(path: str | Path, option: str = "--csv", force: bool = False) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto the target only on success.

    On any exception (Ctrl-C included) the temporary file is removed, so a reader never sees
    half a file and an interrupted run leaves nothing behind.
    """
    target = check_writable(path, option, force)
    handle, tmp_name = tempfile.mkstemp(prefix=_scratch_prefix(target), suffix=".tmp", dir=target.parent)
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
        raise OutputError(f"{option} {elide(str(path), 200)}: write failed ({exc.strerror or exc})") from exc
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
