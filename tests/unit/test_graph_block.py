"""graph's block read back (issue 56): a real graph result of the toy, on qk's data (margin) and on
labelled prompts (contrast), is broken in one place at a time, and each break is refused in one line
naming the file and the JSON path (exit 2 from ``headscope report``, no traceback), while what graph
writes reads, fits the exported JSON Schema, and reads with what graph may write besides (an
unresolved value side, a verified ratio, a negative contrast).

Each invariant refused here holds for every block graph writes (headscope.analyses.graph_block
says why).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from typer.testing import CliRunner

import headscope as hs
from headscope.analyses import graph_block
from headscope.analyses.describe.atlas import json_schema as atlas_schema
from headscope.analyses.graph import edges_of
from headscope.api.result import Result
from headscope.cli import app
from headscope.errors import InputError
from headscope.outputs import schema

runner = CliRunner()
HEAD = 5  # heads[5]: L1H1 of the toy, a layer-1 head (several sources each side)
H = f"graph.heads[{HEAD}]"
NOTHING = "the head writes nothing at the rows read (its output is 0), so no share"


@pytest.fixture(scope="module")
def saved(toy) -> dict[str, Any]:
    """A real graph result of the toy (margin), as headscope writes it, read back as plain JSON."""
    found = hs.graph(toy, repeat_seq=2, seq_len=20, windows=5, rows=0, resamples=200)
    return json.loads(found.to_json())


@pytest.fixture(scope="module")
def contrast(toy, tmp_path_factory) -> dict[str, Any]:
    """A real graph --data result of the toy: 16 labelled prompts of its symbols (s twice, io once)."""
    rows = []
    for i in range(16):
        a, b = 10 + (7 * i) % 50, 10 + (7 * i + 23) % 50
        f = [1 + (i + k) % 9 for k in range(6)]
        text = f"t{f[0]} t{a} t{f[1]} t{b} t{f[2]} t{f[3]} t{b} t{f[4]} t{f[5]}"
        rows.append(
            {"id": f"x{i}", "lang": "en", "template": "toy", "text": text, "io": f"t{a}", "s": f"t{b}"}
        )
    path = tmp_path_factory.mktemp("graph") / "ioi.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return json.loads(hs.graph(toy, data=path, rows=0, resamples=200).to_json())


def _edit(doc: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> Any:
    doc = copy.deepcopy(doc)
    return doc, change(doc)


def _head(doc: dict[str, Any], index: int = HEAD) -> dict[str, Any]:
    return doc["graph"]["heads"][index]


def _edge(doc: dict[str, Any], side: str, head: int | None = None) -> tuple[int, dict[str, Any]]:
    """The first edge on ``side`` (of heads[head], where given) and its index."""
    for index, edge in enumerate(doc["graph"]["edges"]):
        entry = _head(doc, head) if head is not None else None
        if edge["side"] == side and (
            entry is None or (edge["layer"], edge["head"]) == (entry["layer"], entry["head"])
        ):
            return index, edge
    raise AssertionError(f"no {side} edge")


def _origin(doc: dict[str, Any], edge: dict[str, Any]) -> tuple[int, int]:
    """(head index, source index) of the entry an edge copies."""
    for h, entry in enumerate(doc["graph"]["heads"]):
        if (entry["layer"], entry["head"]) == (edge["layer"], edge["head"]):
            return h, next(
                j for j, item in enumerate(entry[edge["side"]]) if item["source"] == edge["source"]
            )
    raise AssertionError("no head")


def _one_line(message: str) -> None:
    assert message.strip() and "\n" not in message, message
    assert len(message) < 700, len(message)


def _unresolve_value(doc: dict[str, Any], index: int = HEAD) -> None:
    """A head as graph writes one that writes nothing: output 0, value shares null, no value edges."""
    entry = _head(doc, index)
    entry.update(output=0.0, value_unresolved=NOTHING)
    for item in entry["value"]:
        item.update(share=None, ci_low=None, ci_high=None)
    doc["graph"]["edges"] = [
        e
        for e in doc["graph"]["edges"]
        if not (e["side"] == "value" and (e["layer"], e["head"]) == (entry["layer"], entry["head"]))
    ]


# --- the breaks: each edits the document and returns what the one line must name ----------------------


def edge_share_changed(d):
    i, edge = _edge(d, "query")
    edge["share"] += 0.01
    return [f"graph.edges[{i}].share", "copies"]


def edge_ci_high_changed(d):
    i, edge = _edge(d, "key")
    edge["ci_high"] += 0.01
    return [f"graph.edges[{i}].ci_high"]


def edge_kind_changed(d):
    i, edge = _edge(d, "key", HEAD)
    edge["kind"] = "mlp" if edge["kind"] != "mlp" else "head"
    return [f"graph.edges[{i}].kind"]


def edge_n_changed(d):
    i, edge = _edge(d, "value")
    edge["n"] += 1
    return [f"graph.edges[{i}].n", "windows"]


def edge_head_missing(d):
    i, edge = _edge(d, "query")
    h, _ = _origin(d, edge)
    del d["graph"]["heads"][h]
    return [f"graph.edges[{i}]", "not one of the block's heads"]


def edge_source_unknown(d):
    i, edge = _edge(d, "key")
    edge["source"] = "L9H9"
    return [f"graph.edges[{i}].source", "L9H9"]


def edge_repeated(d):
    d["graph"]["edges"].append(copy.deepcopy(d["graph"]["edges"][0]))
    return [f"graph.edges[{len(d['graph']['edges']) - 1}]", "repeats edges[0]"]


def edge_dropped(d):
    i, edge = _edge(d, "value", HEAD)
    h, j = _origin(d, edge)
    del d["graph"]["edges"][i]
    return [f"graph.heads[{h}].value[{j}]", "no edge names it"]


def edge_below_threshold(d):
    i, edge = min(enumerate(d["graph"]["edges"]), key=lambda pair: pair[1]["share"])
    d["graph"]["threshold"] = math.nextafter(edge["share"], 1.0)  # just above the weakest edge
    return [f"graph.edges[{i}].share", "threshold"]


def threshold_lowered(d):
    # a source below the threshold, interval above 0, now qualifies: it should be an edge
    d["graph"]["threshold"] = 0.0
    return ["graph.heads[", "no edge names it"]


def edge_interval_at_zero(d):
    i, edge = _edge(d, "key", HEAD)
    h, j = _origin(d, edge)
    edge["ci_low"] = d["graph"]["heads"][h]["key"][j]["ci_low"] = -0.01
    return [f"graph.edges[{i}].ci_low", "above 0"]


def value_edge_measure(d):
    i, edge = _edge(d, "value")
    edge["measure"] = "margin"
    return [f"graph.edges[{i}].measure", '"output"']


def query_edge_measure(d):
    i, edge = _edge(d, "query")
    edge["measure"] = "contrast"
    return [f"graph.edges[{i}].measure", '"margin"']


def measure_unknown(d):
    i, edge = _edge(d, "key")
    edge["measure"] = "score"
    return [f"graph.edges[{i}].measure", "not one of"]


def side_unknown(d):
    i, edge = _edge(d, "key")
    edge["side"] = "output"
    return [f"graph.edges[{i}].side"]


def edge_field_missing(d):
    i, edge = _edge(d, "key")
    del edge["verified_ratio"]
    return [f"graph.edges[{i}]", "verified_ratio"]


def ratio_negative(d):
    i, edge = _edge(d, "key")
    edge["verified_ratio"] = -0.5
    return [f"graph.edges[{i}].verified_ratio", "minimum"]


def value_share_changed(d):
    _head(d)["value"][1]["share"] += 0.2
    return [f"{H}.value:", "sum to"]


def value_source_dropped(d):
    _head(d)["value"].pop(1)  # the second largest part
    return [f"{H}.value:", "sum to"]


def value_share_null(d):
    _head(d)["value"][0]["share"] = None
    return [f"{H}.value[0].share", "null on a resolved value side"]


def value_interval_reversed(d):
    item = _head(d)["value"][0]
    item["ci_low"], item["ci_high"] = item["ci_high"] + 0.05, item["ci_high"]
    return [f"{H}.value[0].ci_low", "above ci_high"]


def value_unresolved_keeps_a_share(d):
    _unresolve_value(d)
    _head(d)["value"][1]["share"] = 0.4
    return [f"{H}.value[1].share", "value side is unresolved"]


def value_unresolved_with_output(d):
    _unresolve_value(d)
    _head(d)["output"] = 0.5
    return [f"{H}.output", "only where its output is 0"]


def value_unresolved_empty(d):
    _unresolve_value(d)
    _head(d)["value_unresolved"] = "  "
    return [f"{H}.value_unresolved", "empty"]


def output_zero_resolved(d):
    _head(d)["output"] = 0.0
    return [f"{H}.output", "above 0"]


def output_negative(d):
    _head(d)["output"] = -1.0
    return [f"{H}.output", "minimum"]


def value_missing(d):
    del _head(d)["value"]
    return [H, "value"]


def value_unresolved_missing(d):
    del _head(d)["value_unresolved"]
    return [H, "value_unresolved"]


def query_share_changed(d):  # qk's rule, on graph's heads
    _head(d)["query"][0]["share"] += 0.2
    return [f"{H}.query:", "sum to"]


def margin_negative(d):  # a margin (not a contrast) is above 0
    _head(d)["margin"] = -0.5
    return [f"{H}.margin", "-0.5"]


def head_outside_layout(d):
    _head(d)["head"] = 4
    return [f"{H}.head", "4 heads"]


def block_measure_unknown(d):
    d["graph"]["measure"] = "output"
    return ["graph.measure"]


def threshold_above_1(d):
    d["graph"]["threshold"] = 1.5
    return ["graph.threshold", "maximum"]


def version_newer(d):
    d["graph"]["version"] = 2
    return ["graph.version", "newer headscope", "upgrade"]


def block_not_an_object(d):
    d["graph"] = [1]
    return ["graph:", "object"]


def edges_not_a_list(d):
    d["graph"]["edges"] = {}
    return ["graph.edges", "array"]


BROKEN = [
    edge_share_changed,
    edge_ci_high_changed,
    edge_kind_changed,
    edge_n_changed,
    edge_head_missing,
    edge_source_unknown,
    edge_repeated,
    edge_dropped,
    edge_below_threshold,
    threshold_lowered,
    edge_interval_at_zero,
    value_edge_measure,
    query_edge_measure,
    measure_unknown,
    side_unknown,
    edge_field_missing,
    ratio_negative,
    value_share_changed,
    value_source_dropped,
    value_share_null,
    value_interval_reversed,
    value_unresolved_keeps_a_share,
    value_unresolved_with_output,
    value_unresolved_empty,
    output_zero_resolved,
    output_negative,
    value_missing,
    value_unresolved_missing,
    query_share_changed,
    margin_negative,
    head_outside_layout,
    block_measure_unknown,
    threshold_above_1,
    version_newer,
    block_not_an_object,
    edges_not_a_list,
]


def _closed(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: _closed(value) for key, value in node.items()}
        if "properties" in node and "additionalProperties" not in node:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(item) for item in node]
    return node


def _whole_schema() -> jsonschema.Draft202012Validator:
    registry = Registry().with_resource(atlas_schema()["$id"], Resource.from_contents(atlas_schema()))
    return jsonschema.Draft202012Validator(schema.json_schema(), registry=registry)


@pytest.mark.parametrize("which", ["saved", "contrast"])
def test_a_real_block_reads_and_fits_its_schema(which, request):
    """What graph writes (margin and contrast) reads back, fits the block's exported JSON Schema
    (closed: nothing written that the declaration does not list), and the result's, which inlines it."""
    doc = request.getfixturevalue(which)
    block = doc["graph"]
    assert block["measure"] == ("margin" if which == "saved" else "contrast")
    assert (
        len(block["heads"]) == 8
        and block["edges"]
        and {e["side"] for e in block["edges"]}
        == {
            "query",
            "key",
            "value",
        }
    )
    graph_block.check_graph_block(copy.deepcopy(block), "saved.json", (2, 4, 4))
    back = Result.from_json(copy.deepcopy(doc)).graph
    assert back.edges == block["edges"] and back.measure == block["measure"]
    closed = _closed(graph_block.json_schema())
    jsonschema.Draft202012Validator.check_schema(closed)
    assert [e.message for e in jsonschema.Draft202012Validator(closed).iter_errors(block)] == []
    assert [e.message for e in _whole_schema().iter_errors(doc)] == []
    inlined = schema.json_schema()["properties"]["graph"]
    assert inlined["properties"]["heads"]["items"] == graph_block.GRAPH_HEAD
    assert inlined["properties"]["edges"]["items"] == graph_block.EDGE


def test_the_schema_refuses_what_the_reader_refuses_where_a_schema_can_say_it(saved):
    for breaks in (output_negative, ratio_negative, side_unknown, threshold_above_1, value_missing):
        broken, _ = _edit(saved, breaks)
        assert list(_whole_schema().iter_errors(broken)), breaks.__name__


@pytest.mark.parametrize("breaks", BROKEN, ids=[b.__name__ for b in BROKEN])
def test_a_broken_graph_block_is_refused_with_its_json_path(saved, breaks):
    broken, names = _edit(saved, breaks)
    with pytest.raises(InputError) as caught:
        Result.from_json(broken)
    message = str(caught.value)
    _one_line(message)
    for needle in names:
        assert needle in message, (breaks.__name__, message)
    # the same refusal from the function GraphResult.from_json calls, naming the file given
    with pytest.raises(InputError) as direct:
        graph_block.check_graph_block(broken["graph"], "saved.json", (2, 4, 4))
    assert str(direct.value).startswith(f"saved.json: {names[0].rstrip(':')}"), str(direct.value)


def test_the_bounds_refused_hold_on_the_real_blocks(saved, contrast):
    """What the checks refuse never occurs in what graph writes: every side sums to 1 far inside
    the tolerance, each edge is its source's entry, above the threshold, interval above 0."""
    for doc in (saved, contrast):
        block = doc["graph"]
        for entry in block["heads"]:
            assert entry["value_unresolved"] is None and entry["output"] > 0
            for side in ("query", "key", "value"):
                assert abs(sum(item["share"] for item in entry[side]) - 1) < 1e-6
        for edge in block["edges"]:
            h, j = _origin(doc, edge)
            item = block["heads"][h][edge["side"]][j]
            assert edge["share"] == item["share"] >= block["threshold"] and edge["ci_low"] > 0


def test_a_contrast_may_be_negative_but_not_unresolved(saved, contrast):
    """On labelled prompts a resolved head's contrast is signed (the toy writes one below 0, and it
    reads); a contrast of 0, or one whose size is below its resolution, is refused; a margin below
    0 is refused as before."""
    heads = contrast["graph"]["heads"]
    negative = [i for i, entry in enumerate(heads) if entry["margin"] < 0 and entry["unresolved"] is None]
    assert negative, [entry["margin"] for entry in heads]
    i = negative[0]
    Result.from_json(copy.deepcopy(contrast))
    flipped, _ = _edit(
        contrast, lambda d: d["graph"]["heads"][HEAD].update(margin=-d["graph"]["heads"][HEAD]["margin"])
    )
    Result.from_json(flipped)
    for margin, needle in ((0.0, "away from 0"), (-heads[i]["resolution"] / 2, "in size below")):
        broken, _ = _edit(contrast, lambda d, m=margin: d["graph"]["heads"][i].update(margin=m))
        with pytest.raises(InputError) as caught:
            Result.from_json(broken)
        assert f"graph.heads[{i}].margin" in str(caught.value) and needle in str(caught.value)
    as_margin, _ = _edit(contrast, lambda d: d["graph"].update(measure="margin"))
    with pytest.raises(InputError, match=rf"graph\.heads\[{i}\]\.margin"):
        Result.from_json(as_margin)
    # a contrast block's query and key edges are of the contrast
    broken, names = _edit(contrast, lambda d: _edge(d, "key")[1].update(measure="margin"))
    with pytest.raises(InputError, match=r"graph\.edges\[\d+\]\.measure: \"margin\" on a key-side edge"):
        Result.from_json(broken)


def test_what_graph_may_write_besides_reads(saved):
    """An unresolved value side (output 0, no value shares or edges), verified edges, and a block
    without intervals (--resamples 0: edges kept by their share alone) read."""
    unresolved, _ = _edit(saved, _unresolve_value)
    found = Result.from_json(unresolved).graph.head(1, 1)
    assert found["value_unresolved"] == NOTHING and found["value"][0]["share"] is None
    for side in ("query", "key", "value"):  # --verify's ratio, on whichever side it checks
        verified, _ = _edit(saved, lambda d, side=side: _edge(d, side)[1].update(verified_ratio=2.5))
        Result.from_json(verified)

    def no_intervals(doc: dict[str, Any]) -> None:  # as graph --resamples 0 writes it
        block = doc["graph"]
        for entry in block["heads"]:
            for side in ("query", "key", "value"):
                for item in entry[side]:
                    item.update(ci_low=None, ci_high=None)
        block["edges"] = edges_of(block["heads"], block["threshold"], block["measure"])

    bare, _ = _edit(saved, no_intervals)
    assert len(bare["graph"]["edges"]) >= len(saved["graph"]["edges"])
    Result.from_json(bare)


def test_the_edges_are_edges_of_the_heads(saved, contrast):
    """The rule the reader holds the edges to is graph's own: edges_of the saved heads gives the
    saved edges (before --verify writes its ratios)."""
    for doc in (saved, contrast):
        block = doc["graph"]
        assert edges_of(block["heads"], block["threshold"], block["measure"]) == block["edges"]


def test_report_refuses_a_damaged_graph_block(saved, tmp_path):
    good = tmp_path / "graph.json"
    good.write_text(json.dumps(saved))
    done = runner.invoke(app, ["report", str(good), "--html", str(tmp_path / "good.html"), "--no-examples"])
    assert done.exit_code == 0, done.stderr
    for breaks in (edge_share_changed, value_share_changed, edge_dropped):
        broken, names = _edit(saved, breaks)
        damaged = tmp_path / f"{breaks.__name__}.json"
        damaged.write_text(json.dumps(broken))
        target = tmp_path / f"{breaks.__name__}.html"
        result = runner.invoke(app, ["report", str(damaged), "--html", str(target), "--no-examples"])
        assert result.exit_code == 2, (breaks.__name__, result.exit_code, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, result.stderr
        line = result.stderr.replace("\n", " ")
        assert damaged.name in line and names[0] in line, line
        assert not target.exists()
