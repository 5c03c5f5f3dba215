"""Saved results: a result file (``--format json`` output), or one run of a ``headscope sweep`` store.

``headscope report`` reads either; a folder with a ``manifest.json`` is a sweep store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headscope import __version__
from headscope.errors import InputError

from .store import Store, read_manifest

RESULT_KEYS = {"headscope", "command", "model", "sections", "rows"}


def load_result(path: str | Path, run: str | None = None) -> dict[str, Any]:
    """A saved headscope result (``--format json``), or one run of a sweep store (``run``: its key or
    model label; default the last finished run), checked: exit 2 with one line when it is not one."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{path}: no such file", hint="give the output of headscope scan --format json")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return load_sweep_run(path, run)
        raise InputError(
            f"{path}: is a folder without a sweep manifest",
            hint="give the output of headscope scan --format json, or a headscope sweep store",
        )
    if run is not None:  # a run names one run of a sweep store; a file holds one result
        raise InputError(
            f"run={run!r}: {path} is one saved result, not a sweep store",
            hint="drop run=, or give the sweep store's folder",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; not a headscope result") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); truncated?",
            hint="give the complete output of headscope scan --format json",
        ) from None
    if not isinstance(data, dict) or not set(data) >= RESULT_KEYS:
        missing = sorted(RESULT_KEYS - set(data)) if isinstance(data, dict) else sorted(RESULT_KEYS)
        raise InputError(
            f"{path}: not a headscope result (missing {', '.join(missing)})",
            hint="give the output of headscope scan --format json",
        )
    if not isinstance(data["rows"], list) or not data["rows"]:
        raise InputError(f"{path}: the result holds no head rows")
    return data


def load_sweep_run(folder: Path, run: str | None = None) -> dict[str, Any]:
    """One finished run of a ``headscope sweep`` store as a result dictionary."""
    store = Store(folder)
    store.runs, _ = read_manifest(folder / "manifest.json")  # InputError naming the JSON path
    done = {key: entry for key, entry in store.runs.items() if entry.get("status") == "done"}
    if not done:
        raise InputError(f"{folder}: the sweep store holds no finished run")
    if run is None:
        key = max(done, key=lambda k: (done[k].get("step") is not None, done[k].get("step") or 0, k))
    else:
        matches = [
            k for k, e in done.items() if run in (k, e.get("label"), f"{e.get('label')}:{e.get('analysis')}")
        ]
        if not matches:
            raise InputError(f"--run {run}: no finished run of {folder} has that key or label")
        key = matches[0]
    entry = done[key]
    done_ok, why = store.is_done(key, entry["options"], entry["fingerprint"])
    if not done_ok:
        causes = {"result file missing": "is missing", "checksum mismatch": "does not match its checksum"}
        cause = causes.get(why, why.removeprefix("result file "))
        raise InputError(
            f"{folder}: run {key}'s result file {store.file_of(key).relative_to(folder)} {cause}",
            hint="rerun the sweep to compute it again",
        )
    try:
        payload = store.load(key)
    except (OSError, ValueError):
        raise InputError(
            f"{folder}: run {key}'s result file cannot be read", hint="rerun the sweep"
        ) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("rows"), list):
        raise InputError(f"{folder}: run {key}'s result file holds no rows list", hint="rerun the sweep")
    found = {
        "headscope": entry.get("headscope", __version__),
        "command": str(entry.get("analysis", "sweep")),
        "model": entry.get("label", key),
        "spec": entry.get("spec"),
        "sections": [],
        "rows": payload["rows"],
        "notes": [f"sweep store {folder}, run {key}", *payload.get("notes", [])],
        "copy_loss": None,
        "layout": {"layers": payload.get("layers"), "heads": payload.get("heads")},
    }
    # The analysis' own records (describe's atlas), checked with the rest by Result.from_json.
    document = payload.get("document")
    if isinstance(document, dict):
        found.update({key: value for key, value in document.items() if key not in found})
    return found
