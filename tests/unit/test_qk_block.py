"""qk's block and describe's why blocks read back (issue 55, item 5): a real qk result and a real
describe --why atlas of the toy are broken in one place at a time, and each break is refused in one
line naming the file and the JSON path (exit 2 from the CLI, no traceback), while what qk writes, an
unresolved head included, and a block written before ``unresolved`` existed still read.

Each invariant refused here holds for every block qk writes (headscope.analyses.qk_block says why).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import numpy as np
import pytest
from referencing import Registry, Resource
from typer.testing import CliRunner

import headscope as hs
from headscope.analyses import qk_block
from headscope.analyses.describe.atlas import Atlas
from headscope.analyses.describe.atlas import json_schema as atlas_schema
from headscope.api.result import Result
from headscope.cli import app
from headscope.errors import InputError
from headscope.outputs import schema

runner = CliRunner()
HEAD = 5  # a layer-1 head of the toy (several sources each side)
REASON = "its margin is not above 100x its float rounding"


@pytest.fixture(scope="module")
def saved_qk(toy) -> dict[str, Any]:
    """A real qk result of the toy, as headscope writes it, read back as plain JSON."""
    return json.loads(hs.qk(toy, repeat_seq=2, seq_len=12, windows=5, rows=0, resamples=200).to_json())


@pytest.fixture(scope="module")
def described(toy, tmp_path_factory) -> dict[str, Any]:
    """A real describe --why result of the toy (on repeated text: its induction heads have sources)."""
    rng = np.random.default_rng(1)
    lines = []
    for _ in range(8):
        segment = " ".join(f"t{i}" for i in rng.integers(0, 60, 12))
        lines.append(f"{segment} {segment}")
    text = tmp_path_factory.mktemp("why") / "repeated.txt"
    text.write_text("\n\n".join(lines) + "\n")
    result = hs.describe(toy, eval_text=text, context=32, windows=5, resamples=200, why=True)
    return json.loads(result.to_json())


def _edit(doc: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    change(doc)
    return doc


def _unresolve(entry: dict[str, Any], margin: float = -2e-9) -> None:
    """A head as qk writes one whose margin is not resolved."""
    entry["unresolved"] = REASON
    entry["margin"] = margin
    for side in ("key", "query"):
        for item in entry[side]:
            item.update(share=None, ci_low=None, ci_high=None)
    entry.pop("pairs", None)
    entry.pop("reconstructed", None)


def _head(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["qk"]["heads"][HEAD]


def _set(where: Callable[[dict[str, Any]], dict[str, Any]], key: str | int, value: Any):
    return lambda doc: where(doc).__setitem__(key, value)


def _key0(doc: dict[str, Any]) -> dict[str, Any]:
    return _head(doc)["key"][0]


def _rebuilt(doc: dict[str, Any]) -> dict[str, Any]:
    return _head(doc)["reconstructed"][2]


def _flip_interval(item: dict[str, Any]) -> None:
    item["ci_low"], item["ci_high"] = item["ci_high"] + 0.05, item["ci_high"]


def _one_line(message: str) -> None:
    assert message.strip() and "\n" not in message, message
    assert len(message) < 600, len(message)


# (id, how the qk block is broken, what the one line must name); HEAD = 5
H = f"qk.heads[{HEAD}]"
BROKEN_QK: list[tuple[str, Callable[[dict[str, Any]], Any], list[str]]] = [
    ("share-deleted", lambda d: _key0(d).pop("share"), [f"{H}.key[0]", "share"]),
    (
        "share-changed",
        lambda d: _key0(d).__setitem__("share", _key0(d)["share"] + 0.2),
        [f"{H}.key:", "sum to"],
    ),
    ("source-dropped", lambda d: _head(d)["query"].pop(0), [f"{H}.query:", "sum to"]),
    ("share-null-resolved", _set(_key0, "share", None), [f"{H}.key[0].share", "null on a resolved head"]),
    ("share-text", _set(_key0, "share", "0.4"), [f"{H}.key[0].share"]),
    ("margin-negative", _set(_head, "margin", -0.5), [f"{H}.margin", "-0.5"]),
    ("margin-zero", _set(_head, "margin", 0.0), [f"{H}.margin"]),
    ("margin-below-resolution", _set(_head, "resolution", 1e6), [f"{H}.margin", "resolution"]),
    ("resolution-negative", _set(_head, "resolution", -1.0), [f"{H}.resolution"]),
    ("interval-reversed", lambda d: _flip_interval(_key0(d)), [f"{H}.key[0].ci_low", "above ci_high"]),
    ("rebuilt-1.5", _set(_rebuilt, "explained", 1.5), [f"{H}.reconstructed[2].explained", "1.5"]),
    ("rebuilt-ci-above-1", _set(_rebuilt, "ci_high", 1.2), [f"{H}.reconstructed[2].ci_high"]),
    ("rebuilt-negative", _set(_rebuilt, "explained", -0.1), [f"{H}.reconstructed[2].explained"]),
    ("rebuilt-interval-reversed", lambda d: _flip_interval(_rebuilt(d)), [f"{H}.reconstructed[2].ci_low"]),
    (
        "unresolved-empty",
        lambda d: (_unresolve(_head(d)), _head(d).update(unresolved=" ")),
        [f"{H}.unresolved"],
    ),
    ("unresolved-number", _set(_head, "unresolved", 3), [f"{H}.unresolved"]),
    (
        "unresolved-keeps-a-share",
        lambda d: (_unresolve(_head(d)), _head(d)["query"][1].update(share=0.3)),
        [f"{H}.query[1].share", "unresolved"],
    ),
    (
        "unresolved-keeps-an-interval",
        lambda d: (_unresolve(_head(d)), _head(d)["key"][0].update(ci_high=0.3)),
        [f"{H}.key[0].ci_high"],
    ),
    (
        "unresolved-keeps-its-rebuild",
        lambda d: (_unresolve(_head(d)), _head(d).update(reconstructed=[{"k": 3, "explained": 0.5}])),
        [f"{H}.reconstructed", "unresolved"],
    ),
    ("layer-beyond-model", _set(_head, "layer", 2), [f"{H}.layer", "2 layers"]),
    ("head-beyond-model", _set(_head, "head", 4), [f"{H}.head", "4 heads"]),
    ("head-repeated", lambda d: d["qk"]["heads"].append(copy.deepcopy(_head(d))), ["qk.heads[8]", "again"]),
    ("head-without-margin", lambda d: _head(d).pop("margin"), [H, "margin"]),
    ("heads-not-a-list", lambda d: d["qk"].__setitem__("heads", {}), ["qk.heads", "array"]),
    ("block-not-an-object", lambda d: d.__setitem__("qk", [1]), ["qk:", "object"]),
    ("version-newer", lambda d: d["qk"].__setitem__("version", 2), ["qk.version", "newer headscope"]),
    ("version-true", lambda d: d["qk"].__setitem__("version", True), ["qk.version"]),
    (
        "example-attention-above-1",
        lambda d: _head(d)["example"]["keys"][0].__setitem__("attention", 1.5),
        [f"{H}.example.keys[0].attention"],
    ),
    (
        "example-parts-differ",
        lambda d: _head(d)["example"]["keys"][1]["parts"].pop(
            next(iter(_head(d)["example"]["keys"][1]["parts"]))
        ),
        [f"{H}.example.keys[1].parts"],
    ),
]
BROKEN_IDS = [case[0] for case in BROKEN_QK]


def test_the_real_block_reads_and_fits_its_schema(saved_qk):
    """What qk writes reads back, fits the block's exported JSON Schema (closed: nothing written
    that the declaration does not list), and the result's schema, which inlines it."""
    block = saved_qk["qk"]
    assert len(block["heads"]) == 8 and _head(saved_qk)["layer"] == 1
    qk_block.check_qk_block(copy.deepcopy(block), "saved.json", (2, 4, 4))
    Result.from_json(copy.deepcopy(saved_qk))
    closed = _closed(qk_block.json_schema())
    jsonschema.Draft202012Validator.check_schema(closed)
    assert list(jsonschema.Draft202012Validator(closed).iter_errors(block)) == []
    registry = Registry().with_resource(atlas_schema()["$id"], Resource.from_contents(atlas_schema()))
    whole = jsonschema.Draft202012Validator(schema.json_schema(), registry=registry)
    assert [e.message for e in whole.iter_errors(saved_qk)] == []
    assert schema.json_schema()["properties"]["qk"]["properties"]["heads"]["items"] == qk_block.HEAD


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: _closed(value) for key, value in node.items()}
        if "properties" in node and "additionalProperties" not in node:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(item) for item in node]
    return node


@pytest.mark.parametrize(("case", "breaks", "names"), BROKEN_QK, ids=BROKEN_IDS)
def test_a_broken_qk_block_is_refused_with_its_json_path(saved_qk, case, breaks, names):
    broken = _edit(saved_qk, breaks)
    with pytest.raises(InputError) as caught:
        Result.from_json(broken)
    message = str(caught.value)
    _one_line(message)
    for needle in names:
        assert needle in message, (case, message)
    if case == "version-newer":
        assert "upgrade" in message
    # the same refusal from the function QKResult.from_json calls, naming the file given
    with pytest.raises(InputError) as direct:
        qk_block.check_qk_block(broken["qk"], "saved.json", (2, 4, 4))
    assert str(direct.value).startswith(f"saved.json: {names[0].rstrip(':')}"), str(direct.value)


def test_the_bounds_refused_hold_on_the_real_block(saved_qk):
    """What the checks refuse never occurs in what qk writes: shares sum to 1 far inside the
    tolerance, margins are positive, intervals ordered, rebuilds inside [0, 1]."""
    for entry in saved_qk["qk"]["heads"]:
        assert not entry.get("unresolved") and entry["margin"] > 0
        for side in ("key", "query"):
            assert abs(sum(item["share"] for item in entry[side]) - 1) < 1e-6
        for item in entry["reconstructed"]:
            assert 0 <= item["ci_low"] <= item["ci_high"] <= 1 and 0 <= item["explained"] <= 1


def test_an_unresolved_head_and_an_older_block_read(saved_qk):
    """An unresolved head (any margin, null shares, no pairs or rebuild) reads, and so does a block
    written before ``unresolved`` and ``resolution`` existed (its heads are resolved)."""
    unresolved = _edit(saved_qk, lambda d: (_unresolve(_head(d)), _head(d).update(resolution=1e-7)))
    found = Result.from_json(unresolved).qk.head(1, 1)
    assert found["unresolved"] == REASON and found["key"][0]["share"] is None
    positive = _edit(saved_qk, lambda d: _unresolve(_head(d), margin=0.3))  # any finite margin
    Result.from_json(positive)
    empty_lists = _edit(
        saved_qk, lambda d: (_unresolve(_head(d)), _head(d).update(pairs=[], reconstructed=[]))
    )
    Result.from_json(empty_lists)

    def older(doc: dict[str, Any]) -> None:
        for entry in doc["qk"]["heads"]:
            entry.pop("unresolved", None)
            entry.pop("resolution", None)

    Result.from_json(_edit(saved_qk, older))
    with pytest.raises(InputError, match=r"qk\.heads\[5\]\.margin"):
        Result.from_json(_edit(saved_qk, lambda d: (older(d), _head(d).update(margin=-1e-9))))


def test_report_html_refuses_a_damaged_qk_block_instead_of_dropping_its_section(saved_qk, tmp_path):
    good = tmp_path / "qk.json"
    good.write_text(json.dumps(saved_qk))
    page = tmp_path / "good.html"
    done = runner.invoke(app, ["report", str(good), "--html", str(page), "--no-examples"])
    assert done.exit_code == 0, done.stderr
    assert "Why each head attends" in page.read_text(encoding="utf-8")
    for case, path in (("share-deleted", "key[0]"), ("rebuilt-1.5", "reconstructed[2].explained")):
        breaks = dict((c, b) for c, b, _ in BROKEN_QK)[case]
        damaged = tmp_path / f"{case}.json"
        damaged.write_text(json.dumps(_edit(saved_qk, breaks)))
        target = tmp_path / f"{case}.html"
        result = runner.invoke(app, ["report", str(damaged), "--html", str(target), "--no-examples"])
        assert result.exit_code == 2, (case, result.exit_code, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, result.stderr
        line = result.stderr.replace("\n", " ")
        assert damaged.name in line and f"{H}.{path}" in line, line
        assert not target.exists()


# --- the atlas's why blocks -------------------------------------------------------------------------

W = 4  # the atlas's heads[4]: L1H0, an induction head with sources each side


def _why(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["atlas"]["heads"][W]["why"]


def _why_unresolved(doc: dict[str, Any]) -> None:
    why = _why(doc)
    why.update(unresolved=REASON, margin=-3e-9, reconstructed=[])
    for side in ("key", "query"):
        for item in why[side]:
            item.update(share=None, ci_low=None, ci_high=None)


BROKEN_WHY: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("margin-negative", lambda d: _why(d).update(margin=-0.5), "why.margin"),
    (
        "rebuilt-1.5",
        lambda d: _why(d)["reconstructed"][2].update(explained=1.5),
        "why.reconstructed[2].explained",
    ),
    ("interval-reversed", lambda d: _flip_interval(_why(d)["key"][0]), "why.key[0].ci_low"),
    ("share-null-resolved", lambda d: _why(d)["query"][0].update(share=None), "why.query[0].share"),
    (
        "unresolved-keeps-a-share",
        lambda d: (_why_unresolved(d), _why(d)["key"][1].update(share=0.2)),
        "why.key[1].share",
    ),
    (
        "unresolved-keeps-its-rebuild",
        lambda d: (_why_unresolved(d), _why(d).update(reconstructed=[{"k": 3, "explained": 0.4}])),
        "why.reconstructed",
    ),
    ("unresolved-empty", lambda d: (_why_unresolved(d), _why(d).update(unresolved="")), "why.unresolved"),
]


@pytest.mark.parametrize(("case", "breaks", "path"), BROKEN_WHY, ids=[c[0] for c in BROKEN_WHY])
def test_a_broken_why_block_is_refused_with_its_json_path(described, case, breaks, path):
    broken = _edit(described, breaks)
    with pytest.raises(InputError) as caught:  # the atlas read alone (compare, card)
        Atlas.from_json(broken["atlas"], "atlas.json")
    message = str(caught.value)
    _one_line(message)
    assert message.startswith(f"atlas.json: heads[{W}].{path}"), (case, message)
    with pytest.raises(InputError) as whole:  # and inside a saved result (report)
        Result.from_json(broken)
    assert f"atlas.heads[{W}].{path}" in str(whole.value), (case, str(whole.value))


def test_a_real_why_block_an_unresolved_one_and_an_older_one_read(described):
    atlas = described["atlas"]
    assert _why(described)["unresolved"] is None and _why(described)["key"][0]["source"] == "L0H1"
    jsonschema.validate(atlas, atlas_schema())
    Result.from_json(copy.deepcopy(described))
    unresolved = _edit(described, _why_unresolved)
    jsonschema.validate(unresolved["atlas"], atlas_schema())
    back = Atlas.from_json(unresolved["atlas"])
    assert back.head(1, 0)["why"]["unresolved"] == REASON

    def older(doc: dict[str, Any]) -> None:  # written before unresolved existed
        for head in doc["atlas"]["heads"]:
            head["why"].pop("unresolved")

    Atlas.from_json(_edit(described, older)["atlas"])
