"""The ``graph`` block of a saved result (``GraphResult.to_json``), declared once: its JSON Schema
(:func:`json_schema`, inlined into the result's by :mod:`headscope.outputs.schema`) and what a schema
cannot say, checked whenever the block is read back (:func:`check_graph_block`; ``check_result``
calls :func:`graph_problems` with the result's layout).

A graph head is a qk head (:data:`headscope.analyses.qk_block.HEAD`) with a value side, and is read
with qk's rules (:func:`headscope.analyses.qk_block.heads_problems`: each head once, inside the
layout; a resolved head's shares given, summing to 1 on each side, intervals ordered, rebuilds in
[0, 1]; an unresolved head's all null). What differs, and what is added, each holding for every
block graph writes (:func:`headscope.analyses.graph.edges_of`, qk's ``_summarise``):

* **The measure.** ``margin``: qk's margin, above 0 where resolved. ``contrast`` (``--data``): the
  answer's keys' mean score minus the distractor's, a signed difference; a head is resolved where
  its size exceeds its rounding bound (qk's ``_unresolved(signed=True)``), so a resolved contrast may
  be negative, not 0, and its size is not below ``resolution``. Its shares are those of ``-num /
  -den`` where negative, so each side still sums to 1.
* **The value side** splits ``output`` (``Σ_q |o(q)|²`` per row, a sum of squares: ≥ 0). It is
  resolved (``value_unresolved`` null) exactly where ``output`` is above 0; then its shares are each
  source's part of that sum over the same total, linear in the sources (qk checks them against the
  output to ``SCORE_TOLERANCE``), so they sum to 1 as the other sides do, and its intervals are
  ordered. Where ``output`` is 0 the reason is given (a non-empty string) and every value share and
  interval is null. The two sides' resolutions are independent.
* **The edges** are :func:`~headscope.analyses.graph.edges_of` of the heads, so each is a copy of
  one source entry: its (layer, head) is a head of the block, its source is on that head's side
  (once per (layer, head, side, source)), its ``share``, ``ci_low``, ``ci_high``, ``kind`` and
  ``role`` are that entry's, ``n`` is the head's ``windows``; its share is at least the block's
  ``threshold`` and its ``ci_low``, where there is one, above 0; its ``measure`` is ``output`` on the
  value side, else the block's. Conversely every source entry that qualifies so is an edge (none
  is dropped). ``verified_ratio`` is null, or ``--verify``'s ratio of two moves (the top source's
  removal over random sources', each a mean of total variations or absolute changes, the random
  one above float rounding): finite and ≥ 0. Which sides carry one is ``--verify``'s business (the
  key side today; each side with an edge in graph_verify), so it is not checked.

Not checked: the order of edges and of sources (an order, not a fact), ``pairs`` (fractions of a
positive margin only), ``composition`` (weights only).
"""

from __future__ import annotations

from typing import Any

from headscope.core import schemacheck
from headscope.errors import InputError

from . import qk_block
from .qk_block import HEAD, SOURCE, UNRESOLVED, NewerBlock

VERSION = 1
GRAPH_HINT = "give the result as headscope graph wrote it (--format json), or rerun headscope graph"
MEASURES = ("margin", "contrast")  # the query and key sides'
VALUE_MEASURE = "output"  # the value side's
SIDES = ("query", "key", "value")
VALUE_UNRESOLVED_WHY = (
    "on a head whose value side is unresolved (value_unresolved): its output is not split, so every "
    "value share and interval is null"
)

_COUNT = qk_block._COUNT  # qk's declarations of a count and of a number or null
_NUMBER_OR_NULL = qk_block._NUMBER_OR_NULL

GRAPH_HEAD: dict[str, Any] = {
    **HEAD,
    "description": "one head: each source's share of its margin (or contrast), query and key side, and "
    "of its output, value side; each head once, inside the result's layout",
    "required": [*HEAD["required"], "windows", "value", "output", "value_unresolved"],
    "properties": {
        **HEAD["properties"],
        "margin": {
            "type": "number",
            "description": "per row: the block's measure. margin: sum_k (A - 1/n) s, above 0 (and not "
            "below resolution) where the head is resolved. contrast: the answer's keys' mean score "
            "minus the distractor's, signed; its size not below resolution where resolved",
        },
        "value": {
            "type": "array",
            "items": SOURCE,
            "description": "every source's share of the head's output (sum_q <o_b(q), o(q)> / "
            "sum_q |o(q)|^2), by |share|; sums to 1 (to 1e-4) where value_unresolved is null",
        },
        "output": {
            "type": "number",
            "minimum": 0,
            "description": "per row: sum_q |o(q)|^2, what the head writes; above 0 exactly where "
            "value_unresolved is null",
        },
        "value_unresolved": {
            **UNRESOLVED,
            "description": "null: the output is above 0 and split; else why not (then every value "
            "share and interval is null)",
        },
    },
}
EDGE: dict[str, Any] = {
    "type": "object",
    "description": "a (head, side, source) whose share is at least the threshold, its interval above "
    "0: a copy of that source's entry in heads; every such entry is an edge",
    "required": [
        "layer",
        "head",
        "side",
        "source",
        "share",
        "ci_low",
        "ci_high",
        "n",
        "measure",
        "verified_ratio",
    ],
    "properties": {
        "layer": _COUNT,
        "head": _COUNT,
        "side": {"enum": list(SIDES)},
        "source": SOURCE["properties"]["source"],
        "kind": SOURCE["properties"]["kind"],
        "role": SOURCE["properties"]["role"],
        "share": {"type": "number", "description": "its share of the side (at least threshold)"},
        "ci_low": {
            **_NUMBER_OR_NULL,
            "description": "95% bootstrap interval, low end: above 0 (null: --resamples 0)",
        },
        "ci_high": {**_NUMBER_OR_NULL, "description": "its high end"},
        "n": {"type": "integer", "minimum": 1, "description": "the head's evaluation windows"},
        "measure": {
            "enum": [*MEASURES, VALUE_MEASURE],
            "description": "what the share is of: output on the value side, else the block's measure",
        },
        "verified_ratio": {
            **_NUMBER_OR_NULL,
            "minimum": 0,
            "description": "--verify: the move from removing this source over the move from "
            "removing random lower sources; null where not checked",
        },
    },
}


def json_schema() -> dict[str, Any]:
    """The graph block's JSON Schema (draft 2020-12, the part :mod:`headscope.core.schemacheck` reads)."""
    qk = qk_block.json_schema()["properties"]
    return {
        "type": "object",
        "description": f"headscope graph's heads and edges (version {VERSION}): per head, each source's "
        "share of its query, key and value sides; an edge where a share is clear (see "
        "docs/analyses/graph.md)",
        "required": ["version", "measure", "threshold", "heads", "edges"],
        "properties": {
            "version": {**qk["version"], "const": VERSION},
            "data": qk["data"],
            "measure": {
                "enum": list(MEASURES),
                "description": "what the query and key sides split: margin (qk's data) or contrast "
                "(labelled prompts, --data)",
            },
            "threshold": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "description": "an edge's least share (--threshold)",
            },
            "windows": qk["windows"],
            "check": qk["check"],
            "heads": {"type": "array", "items": GRAPH_HEAD},
            "edges": {"type": "array", "items": EDGE},
        },
    }


# --- reading ------------------------------------------------------------------------------------------


def check_graph_block(data: Any, source: str = "result", layout: tuple[int, int, int] | None = None) -> None:
    """Refuse a graph block that does not fit :func:`json_schema` or its invariants (the module's
    docstring), in one line naming ``source`` and the JSON path (``graph.edges[3].share``).

    ``layout``: (layers, heads, kv_heads) of the model, where known; every head must lie inside it."""
    try:
        graph_problems(data, layout)
    except schemacheck.SchemaProblem as problem:
        where, hint = located(problem)
        raise InputError(f"{source}: {where}: {problem.problem}", hint=hint) from None


def located(problem: schemacheck.SchemaProblem) -> tuple[str, str]:
    """A problem :func:`graph_problems` raised: its JSON path in the result (``graph.edges[3]``) and
    the hint that goes with it (upgrade for a newer block, else give the file as written)."""
    where = "graph" if problem.where == "the document" else f"graph.{problem.where}"
    return where, (qk_block.UPGRADE if isinstance(problem, NewerBlock) else GRAPH_HINT)


def graph_problems(data: Any, layout: tuple[int, int, int] | None = None) -> None:
    """:func:`check_graph_block`'s checks, raising :class:`~headscope.core.schemacheck.SchemaProblem`
    at the first, its path inside the block (``heads[3].value[0].share``)."""
    qk_block.opening(data, "graph", VERSION, json_schema())
    heads = data["heads"]
    qk_block.heads_problems(heads, layout, signed=data["measure"] == "contrast")
    for index, entry in enumerate(heads):
        _value_problems(f"heads[{index}]", entry)
    _edges_problems(data)


def _value_problems(where: str, entry: dict[str, Any]) -> None:
    output, why = entry["output"], entry["value_unresolved"]
    if why is None:
        if output <= 0:
            raise schemacheck.SchemaProblem(
                f"{where}.output",
                f"{_shown(output)} on a head whose value side is resolved (value_unresolved null): a "
                "head's output is split only where it writes something (output above 0)",
            )
        qk_block.side_problems(
            f"{where}.value", entry["value"], every_source=True, resolved="a resolved value side"
        )
        return
    if not why.strip():
        raise schemacheck.SchemaProblem(
            f"{where}.value_unresolved",
            "expected null or the reason the value side is unresolved, got an empty string",
        )
    if output != 0:
        raise schemacheck.SchemaProblem(
            f"{where}.output",
            f"{_shown(output)} on a head whose value side is unresolved: its value side is unresolved "
            "only where its output is 0",
        )
    qk_block.null_side_problems(f"{where}.value", entry["value"], VALUE_UNRESOLVED_WHY)


def _qualifies(item: dict[str, Any], threshold: float) -> bool:
    """What makes a source entry an edge (graph.edges_of)."""
    share, low = item.get("share"), item.get("ci_low")
    return share is not None and share >= threshold and (low is None or low > 0)


def _edges_problems(data: dict[str, Any]) -> None:
    heads = {(entry["layer"], entry["head"]): index for index, entry in enumerate(data["heads"])}
    threshold, measure = data["threshold"], data["measure"]
    seen: dict[tuple[int, int, str, str], int] = {}
    for index, edge in enumerate(data["edges"]):
        at = f"edges[{index}]"
        layer, head, side, source = edge["layer"], edge["head"], edge["side"], edge["source"]
        if (layer, head) not in heads:
            raise schemacheck.SchemaProblem(
                at, f"L{layer}H{head} is not one of the block's heads: an edge is a source of one of them"
            )
        h = heads[(layer, head)]
        entry = data["heads"][h]
        found = [j for j, item in enumerate(entry[side]) if item["source"] == source]
        if not found:
            raise schemacheck.SchemaProblem(
                f"{at}.source",
                f"{_shown(source)} is not among heads[{h}].{side}'s sources (L{layer}H{head}): an edge "
                "is one of the head's sources",
            )
        ident = (layer, head, side, source)
        if ident in seen:
            raise schemacheck.SchemaProblem(
                at,
                f"repeats edges[{seen[ident]}] (L{layer}H{head} {side} {source}): each (head, side, "
                "source) is one edge",
            )
        seen[ident] = index
        expected = VALUE_MEASURE if side == "value" else measure
        if edge["measure"] != expected:
            raise schemacheck.SchemaProblem(
                f"{at}.measure",
                f"{_shown(edge['measure'])} on a {side}-side edge of a {measure} block: expected "
                f"{_shown(expected)} (the value side splits the output, the others the block's measure)",
            )
        if edge["share"] < threshold:
            raise schemacheck.SchemaProblem(
                f"{at}.share",
                f"{_shown(edge['share'])} is below the block's threshold {_shown(threshold)}: an edge's "
                "share is at least it",
            )
        if edge["ci_low"] is not None and edge["ci_low"] <= 0:
            raise schemacheck.SchemaProblem(
                f"{at}.ci_low",
                f"{_shown(edge['ci_low'])}: an edge's interval is above 0 (null only without intervals)",
            )
        item = entry[side][found[0]]
        origin = f"heads[{h}].{side}[{found[0]}]"
        for name in ("share", "ci_low", "ci_high"):
            if edge[name] != item.get(name):
                raise schemacheck.SchemaProblem(
                    f"{at}.{name}",
                    f"{_shown(edge[name])} is not {origin}.{name} ({_shown(item.get(name))}): an edge "
                    "copies its source's entry",
                )
        for name in ("kind", "role"):
            if name in edge and edge[name] != item.get(name, ""):
                raise schemacheck.SchemaProblem(
                    f"{at}.{name}",
                    f"{_shown(edge[name])} is not {origin}.{name} ({_shown(item.get(name, ''))}): an "
                    "edge copies its source's entry",
                )
        if edge["n"] != entry["windows"]:
            raise schemacheck.SchemaProblem(
                f"{at}.n",
                f"{edge['n']} is not heads[{h}].windows ({entry['windows']}): an edge's n is its head's "
                "evaluation windows",
            )
    for h, entry in enumerate(data["heads"]):
        for side in SIDES:
            for j, item in enumerate(entry[side]):
                ident = (entry["layer"], entry["head"], side, item["source"])
                if ident not in seen and _qualifies(item, threshold):
                    raise schemacheck.SchemaProblem(
                        f"heads[{h}].{side}[{j}]",
                        f"{item['source']}'s share {_shown(item['share'])} is at least the threshold "
                        f"{_shown(threshold)} with its interval above 0, yet no edge names it: every "
                        "such source is an edge (one was dropped)",
                    )


_shown = schemacheck._shown  # JSON-like: "margin", null
