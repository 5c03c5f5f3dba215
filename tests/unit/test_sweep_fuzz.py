"""Property test (issue 23): any JSON document written as a sweep manifest is either read, or refused
with one InputError line; never another exception type. The same holds for ``headscope report``'s
reader of a store (one finished run)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope.errors import InputError
from headscope.sweeps.results import load_sweep_run
from headscope.sweeps.schema import ENTRY_FIELDS
from headscope.sweeps.store import Store

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
field_values = {
    "status": st.sampled_from(["done", "failed", "running", ""]) | values,
    "options": st.dictionaries(st.text(max_size=5), scalars, max_size=2) | values,
    "fingerprint": st.text(max_size=10) | values,
    "sha256": st.sampled_from(["0" * 64, "a" * 63, "G" * 64]) | values,
    "step": st.integers(-5, 10**6) | values,
}
# Entries near the schema: the known keys, each maybe missing, each a plausible or a random value.
entries = st.fixed_dictionaries(
    {},
    optional={key: field_values.get(key, values) for key in ENTRY_FIELDS} | {"unknown": values},
)
run_keys = st.sampled_from(["toy-1__induction", "a", "../x", "", ".hidden", "x" * 300]) | st.text(max_size=10)
manifests = st.one_of(
    values,
    st.fixed_dictionaries(
        {"runs": st.dictionaries(run_keys, entries | values, max_size=3)},
        optional={
            "schema": st.sampled_from(["headscope-sweep/1", "headscope-sweep/2", "headscope-sweep/1.3", "x"])
            | values,
            "headscope": values,
            "other": values,
        },
    ),
)


def _check_one_line(exc: InputError) -> None:
    text = str(exc)
    assert "\n" not in text and len(text) < 500, text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests, st.booleans())
def test_any_manifest_is_read_or_refused_in_one_line(document, truncate):
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        text = json.dumps(document)
        if truncate:
            text = text[: len(text) // 2]
        (root / "manifest.json").write_text(text, encoding="utf-8")
        store = Store(root)
        try:
            store.open()
        except InputError as exc:
            _check_one_line(exc)
        else:
            for key, entry in store.runs.items():
                store.is_done(key, entry["options"], entry["fingerprint"])
        try:
            load_sweep_run(root)
        except InputError as exc:
            _check_one_line(exc)
