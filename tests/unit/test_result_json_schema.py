"""One declaration of the result document (headscope.outputs.schema): what the writer writes fits the
JSON Schema exported from it, on real results of three analyses (a toy scan, induction, kv-plan); the
schema refuses what the reader refuses; the declared row and role fields are the CSV's columns.

The schema is checked with jsonschema (a dev tool, not a dependency of headscope). Every declared
object is also checked closed (no field the declaration does not list): the writer writes nothing
the declaration does not know.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from conftest import kv_toy_module
from referencing import Registry, Resource

import headscope as hs
from headscope.analyses.describe.atlas import json_schema as atlas_schema
from headscope.outputs import schema
from headscope.verdicts.results import CSV_COLUMNS
from headscope.verdicts.roles import ROLES_CSV_COLUMNS

FAST = {
    "detectors": "previous-token,duplicate-token,induction,sink",
    "resamples": 200,
    "seq_len": 20,
    "n_seqs": 8,
}


def _closed(node: Any) -> Any:
    """The schema with every declared object closed: a field the declaration does not list fails."""
    if isinstance(node, dict):
        out = {key: _closed(value) for key, value in node.items()}
        if "properties" in node and "additionalProperties" not in node:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(item) for item in node]
    return node


def _validator(closed: bool = False) -> jsonschema.Draft202012Validator:
    atlas = atlas_schema()
    registry = Registry().with_resource(atlas["$id"], Resource.from_contents(atlas))
    found = schema.json_schema()
    jsonschema.Draft202012Validator.check_schema(found)
    return jsonschema.Draft202012Validator(_closed(found) if closed else found, registry=registry)


def _errors(document: dict[str, Any], closed: bool = False) -> list[str]:
    return [
        f"{error.json_path}: {error.message[:200]}"
        for error in _validator(closed).iter_errors(json.loads(json.dumps(document)))
    ]


@pytest.fixture(scope="module")
def scanned(toy_dir, toy_texts) -> dict[str, Any]:
    return json.loads(hs.scan(str(toy_dir), text=toy_texts, verify=True, **FAST).to_json())


@pytest.fixture(scope="module")
def induction(toy) -> dict[str, Any]:
    return json.loads(hs.induction(toy.model, toy.tokenizer, seq_len=20, n_seqs=4, resamples=0).to_json())


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> dict[str, Any]:
    kv = kv_toy_module()
    toy = kv.build_kv_toy()
    folder = tmp_path_factory.mktemp("kvtoy")
    needles = kv.write_needles(folder / "needles.yaml")
    haystack = folder / "haystack.txt"
    haystack.write_text("\n".join(kv.haystack_lines(400)) + "\n", encoding="utf-8")
    result = hs.kv_plan(
        toy.model,
        toy.tokenizer,
        sink=4,
        recent=16,
        context="300",
        depths="0.5",
        needles=0,
        resamples=0,
        sparsity="0.5",
        data=str(needles),
        haystack=str(haystack),
    )
    return json.loads(result.to_json())


@pytest.mark.parametrize("name", ["scanned", "induction", "planned"])
def test_what_the_writer_writes_fits_the_exported_schema(request, name):
    document = request.getfixturevalue(name)
    assert document["schema"] == schema.RESULT_SCHEMA
    assert _errors(document) == []
    assert _errors(document, closed=True) == []  # nothing written that the declaration does not list
    hs.Result.from_json(copy.deepcopy(document))  # and the reader, walking the same declaration, agrees


def test_the_documents_hold_what_each_analysis_adds(scanned, induction, planned):
    """The three documents between them exercise the declared parts beyond the rows."""
    assert scanned["roles"] and scanned["verification"] and scanned["role_rule"]
    assert induction["copy_loss"]["per_copy"]
    assert isinstance(planned["kv_plan"], dict) and planned["conformance"]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("rows", 0, "layer"), "1"),
        (("rows", 0, "score"), "high"),
        (("layout", "heads"), 0),
        (("rows",), []),
        (("notes",), "a note"),
        (("schema",), "headscope-result/2"),
        (("copy_loss",), [1.0]),
        (("verification",), 5),
    ],
)
def test_the_schema_and_the_reader_both_refuse_a_wrong_type(induction, path, value):
    document = copy.deepcopy(induction)
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert _errors(document), path
    with pytest.raises(hs.InputError):
        hs.Result.from_json(document)


def test_the_schema_requires_what_the_reader_requires(induction):
    for key in ("rows", "layout", "command", "headscope", "model", "sections"):
        document = {k: v for k, v in induction.items() if k != key}
        assert any("required" in error for error in _errors(document)), key
        with pytest.raises(hs.InputError, match=key):
            hs.Result.from_json(document)


def test_declared_rows_and_roles_are_the_csv_columns():
    assert list(schema.ROW.fields) == CSV_COLUMNS
    assert set(schema.ROLE.fields) == set(ROLES_CSV_COLUMNS)


def test_the_exported_schema_refers_to_the_atlas_schema():
    atlas = schema.json_schema()["properties"]["atlas"]
    assert {"$ref": atlas_schema()["$id"]} in atlas["anyOf"]
