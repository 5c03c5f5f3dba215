"""The sweep manifest's schema: each wrong shape is one line naming the JSON path (issue 23)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from headscope.errors import InputError
from headscope.sweeps.schema import SCHEMA, check_manifest

GOOD_ENTRY = {
    "analysis": "induction",
    "error": None,
    "file": "runs/toy-1__induction.json",
    "fingerprint": "head-tail:00",
    "headscope": "0.1.0",
    "label": "toy",
    "options": {"seed": 0},
    "revision": None,
    "seconds": 1.5,
    "series": "toy",
    "sha256": "0" * 64,
    "spec": "toy",
    "status": "done",
    "step": 100,
}
PATH = Path("store/manifest.json")


def manifest(**entry_changes):
    entry = copy.deepcopy(GOOD_ENTRY)
    for key, value in entry_changes.items():
        if value is KeyError:
            entry.pop(key)
        else:
            entry[key] = value
    return {"schema": SCHEMA, "headscope": "0.1.0", "runs": {"toy-1__induction": entry}}


def refusal(data) -> str:
    with pytest.raises(InputError) as caught:
        check_manifest(data, PATH)
    text = str(caught.value)
    assert "\n" not in text and len(text) < 300
    return text


def test_a_good_manifest_reads_without_notes():
    runs, notes = check_manifest(manifest(), PATH)
    assert runs == {"toy-1__induction": GOOD_ENTRY} and notes == []


@pytest.mark.parametrize(
    ("changes", "where", "message"),
    [
        ({"fingerprint": 12}, "fingerprint", "expected a string, got 12"),
        ({"fingerprint": KeyError}, "fingerprint", "missing"),
        ({"options": [1]}, "options", "expected an object, got [1]"),
        ({"options": KeyError}, "options", "missing"),
        ({"status": "running"}, "status", "expected one of done, failed, got 'running'"),
        ({"status": None}, "status", "expected a string, got None"),
        ({"step": "100"}, "step", "expected an integer or null, got '100'"),
        ({"step": True}, "step", "expected an integer or null, got True"),
        ({"step": -1}, "step", "expected a step >= 0, got -1"),
        ({"step": 1.5}, "step", "expected an integer or null, got 1.5"),
        ({"seconds": "fast"}, "seconds", "expected a number, got 'fast'"),
        ({"seconds": -3}, "seconds", "expected a number >= 0, got -3"),
        ({"seconds": float("nan")}, "seconds", "expected a number >= 0, got nan"),
        ({"sha256": "abc"}, "sha256", "expected 64 hex digits, got 'abc'"),
        ({"sha256": KeyError}, "sha256", "missing"),
        ({"file": KeyError}, "file", "missing"),
        ({"revision": 3}, "revision", "expected a string or null, got 3"),
        ({"label": ["x" * 1000]}, "label", "expected a string, got ['xxxxxxxx"),
    ],
)
def test_wrong_field_types_name_the_json_path(changes, where, message):
    text = refusal(manifest(**changes))
    assert text.startswith(f"{PATH}: runs.toy-1__induction.{where}: {message}")
    assert text.endswith("(delete manifest.json to recompute every run, or use a new --out)")


def test_a_failed_run_needs_no_file_or_checksum():
    runs, _ = check_manifest(manifest(status="failed", file=KeyError, sha256=KeyError, error="boom"), PATH)
    assert runs["toy-1__induction"]["status"] == "failed"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "store/manifest.json: expected a JSON object, got []"),
        ({}, "store/manifest.json: runs: missing"),
        ({"runs": []}, "store/manifest.json: runs: expected an object, got []"),
        ({"runs": {"a": 3}}, "store/manifest.json: runs.a: expected an object, got 3"),
        ({"runs": {"a": None}}, "store/manifest.json: runs.a: expected an object, got None"),
        ({"runs": {"../../etc/x": {}}}, "store/manifest.json: runs.'../../etc/x': not a run key"),
        ({"runs": {"": {}}}, "store/manifest.json: runs.'': not a run key"),
        ({"schema": 2, "runs": {}}, "store/manifest.json: schema: expected a string, got 2"),
        ({"schema": "nope", "runs": {}}, "store/manifest.json: schema: expected headscope-sweep/<version>"),
        ({"headscope": 1.0, "runs": {}}, "store/manifest.json: headscope: expected a string, got 1.0"),
        (
            {"schema": "headscope-sweep/7", "runs": {}},
            "store/manifest.json: schema 'headscope-sweep/7' is newer than this headscope reads "
            "(headscope-sweep/1) (upgrade headscope, or use a new --out)",
        ),
    ],
)
def test_wrong_shapes_of_the_document(data, message):
    assert refusal(data).startswith(message)


def test_a_huge_value_is_elided():
    text = refusal(manifest(fingerprint=list(range(100000))))
    assert len(text) < 300 and "…" in text


def test_unknown_keys_in_this_version_are_a_note_and_the_run_still_reads():
    data = manifest(colour="red")
    data["extra"] = {"a": 1}
    runs, notes = check_manifest(json.loads(json.dumps(data)), PATH)
    assert "toy-1__induction" in runs
    assert notes == [f"{PATH}: unknown keys ignored: extra, runs.toy-1__induction.colour"]
