"""The schema of a sweep store's ``manifest.json``, checked field by field with JSON paths.

A hand-written checker rather than jsonschema (not a dependency): the manifest is small, and each
error names the file, the JSON path and what was expected in one line, e.g.
``manifest.json: runs.toy-1a2b__induction.fingerprint: expected a string, got 12``.

Versions, by rule:

* ``"schema": "headscope-sweep/N"``. Manifests written before the field existed are version 1.
* A newer major version than :data:`VERSION` is refused (its meaning may have changed); an older
  or equal one is read.
* Unknown keys in a known version are kept out of the decision and reported as one note.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from headscope import errors
from headscope.errors import InputError

VERSION = 1
SCHEMA = f"headscope-sweep/{VERSION}"
STATUSES = ("done", "failed")
# A run key names its result file (runs/<key>.json): nothing that could leave the folder.
RUN_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")
SHA256 = re.compile(r"[0-9a-f]{64}")
HINT = "delete manifest.json to recompute every run, or use a new --out"

TOP_KEYS = {"schema", "headscope", "runs"}
# key -> (allowed JSON types, required)
ENTRY_FIELDS: dict[str, tuple[tuple[str, ...], bool]] = {
    "status": (("string",), True),
    "analysis": (("string",), False),
    "options": (("object",), True),
    "inputs": (("object",), False),
    "fingerprint": (("string",), True),
    "spec": (("string",), False),
    "label": (("string",), False),
    "series": (("string",), False),
    "step": (("integer", "null"), False),
    "revision": (("string", "null"), False),
    "headscope": (("string",), False),
    "seconds": (("number",), False),
    "error": (("string", "null"), False),
    "file": (("string",), False),
    "sha256": (("string",), False),
}


def elide(value: Any, limit: int = 40) -> str:
    """A manifest value for a message: its ``repr`` (strings quoted, so ``"12"`` and ``12`` differ),
    one line and cut by :func:`headscope.errors.elide`."""
    return errors.elide(repr(value), limit)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


_ARTICLE = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "object": "an object",
    "array": "an array",
    "null": "null",
    "boolean": "true or false",
}


def _fits(value: Any, types: tuple[str, ...]) -> bool:
    kind = json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


def check_manifest(data: Any, path: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The manifest's runs, checked; and notes (unknown keys). Raises InputError naming the JSON path."""
    name = str(path)

    def fail(where: str, message: str) -> InputError:
        return InputError(f"{name}: {where}: {message}", hint=HINT)

    def expected(where: str, types: tuple[str, ...], value: Any) -> InputError:
        wanted = " or ".join(_ARTICLE[t] for t in types)
        return fail(where, f"expected {wanted}, got {elide(value)}")

    if not isinstance(data, dict):
        raise InputError(f"{name}: expected a JSON object, got {elide(data)}", hint=HINT)
    notes: list[str] = []
    schema = data.get("schema", "headscope-sweep/1")
    if not isinstance(schema, str):
        raise expected("schema", ("string",), schema)
    match = re.fullmatch(r"headscope-sweep/(\d{1,6})(?:\.\d{1,6})?", schema)
    if match is None:
        raise fail("schema", f"expected headscope-sweep/<version>, got {elide(schema)}")
    if int(match.group(1)) > VERSION:
        raise InputError(
            f"{name}: schema {elide(schema)} is newer than this headscope reads ({SCHEMA})",
            hint="upgrade headscope, or use a new --out",
        )
    if "headscope" in data and not isinstance(data["headscope"], str):
        raise expected("headscope", ("string",), data["headscope"])
    if "runs" not in data:
        raise fail("runs", "missing")
    runs = data["runs"]
    if not isinstance(runs, dict):
        raise expected("runs", ("object",), runs)
    unknown = sorted(set(data) - TOP_KEYS)
    checked: dict[str, dict[str, Any]] = {}
    for key, entry in runs.items():
        where = f"runs.{elide(key, 60) if not RUN_KEY.fullmatch(key) else key}"
        if not RUN_KEY.fullmatch(key):
            raise fail(where, "not a run key (letters, digits, '.', '_', '-')")
        if not isinstance(entry, dict):
            raise expected(where, ("object",), entry)
        for field, (types, required) in ENTRY_FIELDS.items():
            if field not in entry:
                if required or (field in ("file", "sha256") and entry.get("status") == "done"):
                    raise fail(f"{where}.{field}", "missing")
                continue
            value = entry[field]
            if not _fits(value, types):
                raise expected(f"{where}.{field}", types, value)
        if entry["status"] not in STATUSES:
            raise fail(
                f"{where}.status", f"expected one of {', '.join(STATUSES)}, got {elide(entry['status'])}"
            )
        step = entry.get("step")
        if step is not None and step < 0:
            raise fail(f"{where}.step", f"expected a step >= 0, got {step}")
        seconds = entry.get("seconds")
        if seconds is not None and not (math.isfinite(seconds) and seconds >= 0):
            raise fail(f"{where}.seconds", f"expected a number >= 0, got {elide(seconds)}")
        if "sha256" in entry and not SHA256.fullmatch(entry["sha256"]):
            raise fail(f"{where}.sha256", f"expected 64 hex digits, got {elide(entry['sha256'])}")
        unknown += [f"{where}.{k}" for k in sorted(set(entry) - set(ENTRY_FIELDS))]
        checked[key] = entry
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        notes.append(f"{name}: unknown keys ignored: {shown}")
    return checked, notes
