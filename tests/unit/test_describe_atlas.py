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
    a = _atlas([_head(0, 0, [("offset-1", 1.0, "all")], "offset-1")])
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
