"""Atlases compared head by head (checkpoints, base against fine-tune), and read back from JSON."""

from __future__ import annotations

import pytest

from headscope.analyses.describe.atlas import Atlas, compare_atlases, describe_components, grid_label
from headscope.errors import InputError


def _head(layer, head, components, dominant):
    return {
        "layer": layer,
        "head": head,
        "kv_group": 0,
        "explained": {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6},
        "explained_off_first": {"value": 0.4, "ci_low": 0.3, "ci_high": 0.5},
        "first_token": 0.2,
        "covered": 0.9,
        "left": 0.5,
        "components": [
            {"template": n.split("-0")[0], "name": n, "weight": w, "query_class": c} for n, w, c in components
        ],
        "dominant": dominant,
        "dominant_kind": "offset",
        "conditioned": any(c != "all" for _, _, c in components),
        "roles": [],
        "contexts": [],
    }


def _atlas(heads, layers=1, n_heads=3):
    estimate = {"value": 0.5, "ci_low": 0.4, "ci_high": 0.6}
    return Atlas(
        model="m",
        layout={"layers": layers, "heads": n_heads, "kv_heads": 1, "causal": True},
        templates=[],
        heads=heads,
        explained=estimate,
        explained_off_first=estimate,
        explained_unconditioned=estimate,
        fit={
            "windows": 2,
            "tokens": 10,
            "sources": [],
            "query_classes": {"punctuation": 1, "content-word": 3},
        },
        evaluation={"from": "x", "windows": 2, "tokens": 10, "queries": 8, "sources": []},
    )


def test_heads_whose_description_changed_are_listed():
    a = _atlas(
        [
            _head(0, 0, [("offset-1", 1.0, "all")], "offset-1"),
            _head(0, 1, [("sink", 0.6, "all"), ("offset-1", 0.4, "all")], "sink"),
            _head(0, 2, [("sink", 0.5, "all"), ("broad", 0.5, "all")], "sink"),
        ]
    )
    b = _atlas(
        [
            _head(0, 0, [("offset-1", 0.95, "all"), ("self", 0.05, "all")], "offset-1"),  # the same, nearly
            _head(0, 1, [("sink", 0.3, "all"), ("offset-1", 0.7, "all")], "offset-1"),  # dominant changed
            _head(0, 2, [("sink", 0.5, "punctuation"), ("broad", 1.0, "content-word")], "broad"),
        ]
    )
    changed = compare_atlases(a, b)
    assert [(c["layer"], c["head"]) for c in changed] == [(0, 2), (0, 1)]  # largest change first
    assert changed[0]["distance"] == pytest.approx(0.3125)  # class shares 1:3 weigh the classes
    first = next(c for c in changed if c["head"] == 1)
    assert first["distance"] == pytest.approx(0.3)
    assert (first["dominant_a"], first["dominant_b"]) == ("sink", "offset-1")
    assert compare_atlases(a, a) == []


def test_atlases_of_different_layouts_are_refused():
    with pytest.raises(InputError, match="different layouts"):
        compare_atlases(_atlas([], 1, 3), _atlas([], 2, 3))


def test_an_atlas_reads_back_from_its_json():
    a = _atlas([_head(0, 0, [("offset-1", 1.0, "all")], "offset-1")], n_heads=1)
    again = Atlas.from_json(a.to_json())
    assert again.to_json() == a.to_json()
    with pytest.raises(InputError, match="headscope-atlas/1"):
        Atlas.from_json({"schema": "something-else"})


def test_descriptions_and_labels_read_well():
    head = _head(
        0,
        0,
        [("sink", 0.7, "punctuation"), ("offset-1", 1.0, "content-word"), ("offset-1", 1.0, "digit")],
        "x",
    )
    assert (
        describe_components(head["components"])
        == "on punctuation: 0.70 sink; on content-word, digit: 1.00 offset-1"
    )
    assert grid_label("offset-1") == "~-1" and grid_label("key-class:punctuation") == "~k:pu"
    assert grid_label("decay") == "~dec" and grid_label("last-delimiter:comma") == "~d:co"


def test_classes_without_a_fit_of_their_own_read_as_otherwise():
    from headscope.analyses.describe.atlas import describe_components

    def comp(name, weight, query_class):
        return {"template": name, "name": name, "weight": weight, "query_class": query_class}

    components = [
        comp("offset-1", 1.0, "punctuation"),
        comp("sink", 1.0, "content-word"),
        comp("sink", 0.8, "digit"),
        comp("offset-1", 0.2, "digit"),
        comp("sink", 0.8, "line-start"),
        comp("offset-1", 0.2, "line-start"),
    ]
    counts = {"punctuation": 90, "content-word": 203, "digit": 3, "line-start": 0}
    text = describe_components(components, fit_counts=counts)
    assert text == (
        "on punctuation: 1.00 offset-1; on content-word: 1.00 sink; "
        "otherwise (digit, line-start: too few fit queries): 0.80 sink + 0.20 offset-1"
    )
    # Without the counts (an old atlas), every class reads as measured, as before.
    assert describe_components(components).startswith("on punctuation: 1.00 offset-1")


# --- a damaged atlas is refused on read, naming the file and the JSON path --------------------------


def _valid() -> dict:
    return _atlas(
        [
            _head(0, 0, [("offset-1", 1.0, "all")], "offset-1"),
            _head(0, 1, [("sink", 0.6, "all"), ("offset-1", 0.4, "all")], "sink"),
            _head(0, 2, [("broad", 1.0, "all")], "broad"),
        ]
    ).to_json()


def _damage(path: str, value, data: dict | None = None) -> dict:
    """``data`` with the value at ``path`` (``heads.1.components.0.weight``) set, or deleted (``...``)."""
    import copy

    data = copy.deepcopy(data or _valid())
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = data
    for part in parts[:-1]:
        target = target[part]
    if value is ...:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value
    return data


DAMAGED = [
    ("heads.1.components.0.weight", 1.5, "heads[1].components[0].weight: 1.5 is above the maximum 1"),
    ("heads.1.components.0.weight", -0.2, "heads[1].components[0].weight: -0.2 is below the minimum 0"),
    ("heads.0.explained.value", 1.7, "heads[0].explained.value: 1.7 is above the maximum 1"),
    ("heads.0.explained", ..., "heads[0]: missing 'explained'"),
    ("heads", ..., ": missing 'heads'"),
    ("heads.2.components", ..., "heads[2]: missing 'components'"),
    ("heads.2.layer", 3, "heads[2].layer: 3 is outside the 1 layers"),
    ("heads.2.head", 1, "heads[2]: L0H1 again (heads[1])"),
    ("heads.1.components.1.weight", 0.5, "weights for query class 'all' sum to 1.1, more than 1"),
    ("heads.0.dominant_kind", "mine", 'heads[0].dominant_kind: "mine" is not one of'),
    ("covered", 1.2, "covered: 1.2 is above the maximum 1"),
    ("heads.0.first_token", "0.4", 'heads[0].first_token: expected number, got "0.4"'),
    ("layout.heads", 4, "heads: 3 heads for a layout of 1 x 4: L0H3 and 0 more have no card"),
]


@pytest.mark.parametrize(("path", "value", "message"), DAMAGED)
def test_a_damaged_atlas_is_refused_on_read(path, value, message):
    import jsonschema

    from headscope.analyses.describe.atlas import json_schema

    damaged = _damage(path, value)
    with pytest.raises(InputError, match="a.json: ") as refused:
        Atlas.from_json(damaged, "a.json")
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
    schema_catches = "outside" not in message and "again" not in message and "sum to" not in message
    if schema_catches and "have no card" not in message:  # the rest a JSON Schema cannot say
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(damaged, json_schema())


def test_the_atlas_and_its_schema_agree_with_jsonschema():
    import jsonschema

    from headscope.analyses.describe.atlas import json_schema

    jsonschema.Draft202012Validator.check_schema(json_schema())
    jsonschema.validate(_valid(), json_schema())
    Atlas.from_json(_valid())


def test_an_atlas_of_another_schema_names_the_file():
    with pytest.raises(InputError, match=r"^b\.json: schema: .headscope-atlas/9. is not an atlas"):
        Atlas.from_json({**_valid(), "schema": "headscope-atlas/9"}, "b.json")


def test_a_built_atlas_that_fails_its_schema_is_not_written():
    from headscope.analyses.describe.atlas import AtlasError

    broken = _atlas([_head(0, 0, [("offset-1", 1.0, "all")], "offset-1")], n_heads=1)
    broken.heads[0]["explained"]["value"] = float("nan")  # a writer must say null
    with pytest.raises(AtlasError, match=r"heads\[0\]\.explained\.value: expected number or null"):
        broken.to_json()


def test_the_schema_reader_refuses_a_keyword_it_does_not_read():
    from headscope.core import schemacheck

    with pytest.raises(ValueError, match="pattern"):
        schemacheck.check({"type": "string", "pattern": "^a"}, "b")
    with pytest.raises(schemacheck.SchemaProblem, match="fits 2 of the 2"):
        schemacheck.check({"oneOf": [{"type": "number"}, {"type": "integer"}]}, 3)
