"""The ``qk`` block of a saved result (``QKResult.to_json``), declared once: its JSON Schema
(:func:`json_schema`, inlined into the result's by :mod:`headscope.outputs.schema`) and what a schema
cannot say, checked whenever the block is read back (:func:`check_qk_block`; ``check_result`` calls
:func:`qk_problems` with the result's layout). ``describe --why`` copies a head's part of the block
into the atlas (its ``why`` block), which is read with the same rules (:data:`SOURCE`,
:data:`RECONSTRUCTED`, :func:`explanation_problems`).

What is refused beyond the schema, and why each always holds for a block qk wrote:

* A head is **resolved** where ``unresolved`` is null (or absent: every block written before it
  existed). Its margin ``m = Σ_q Σ_k (A[q,k] − 1/n_q) s(q,k)`` is positive: per row it is the
  covariance of the scores with the weights softmax gives them, which rise with the score, so it
  is ≥ 0, and 0 only where every visible score is equal (no choice, which qk marks unresolved).
  Where the head states its ``resolution`` (the margin's rounding bound), the margin is not below
  it: qk resolves a head only where its margin exceeds that bound.
* A resolved head's shares on a side sum to 1: each is ``Σ_w num_b / Σ_w m`` over the evaluation
  windows, and the parts ``num_b`` are linear in the sources, summing to the margin. Numerically
  they do so to qk's own check (``SCORE_TOLERANCE``, 1e-4 of the parts' absolute sum, per window;
  qk refuses a run beyond it, and measures under 1e-6): a side may miss 1 by that tolerance times
  ``max(1, Σ|share|)``, no more. (The atlas keeps only the top few sources, so their sum is not
  checked there.)
* An interval's low end is not above its high end (both are percentiles of one bootstrap sample).
  The point estimate is not checked against them: a percentile interval need not contain it.
* ``reconstructed[].explained`` lies in [0, 1]: it is the mean over rows of
  ``Σ_k min(A, softmax(rebuilt scores))``, the overlap of two distributions over the same keys,
  which is at most the predicted distribution's sum, 1; its interval is a bootstrap of the same
  mean. The slack (:data:`EXPLAINED_SLACK`) is for float64 rounding, 1e-12 at 10,000 keys. (It is
  not a sum of signed shares, which could pass 1.)
* An **unresolved** head (``unresolved``: the reason, a non-empty string) has a margin of any
  finite value and no fractions of it: every ``share``, ``ci_low`` and ``ci_high`` is null, and
  ``pairs`` and ``reconstructed`` are absent or empty.
* Each head appears once, inside the result's layout (``check_result``); an example query's keys
  split their scores over the same sources (the HTML report's table has one column per source).
"""

from __future__ import annotations

import math
from typing import Any

from headscope.core import schemacheck
from headscope.errors import InputError

VERSION = 1
# The run's own check: the sources' parts sum to each head's margin to this, relative (qk refuses a
# window beyond it; qk imports it from here).
SCORE_TOLERANCE = 1e-4
QK_HINT = "give the result as headscope qk wrote it (--format json), or rerun headscope qk"
UPGRADE = "upgrade headscope to read it: pip install -U headscope"
# What float64 rounding may add to an overlap of two distributions (1e-12 at 10,000 keys), with room.
EXPLAINED_SLACK = 1e-6
SIDES = ("key", "query")

_NUMBER_OR_NULL = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_NAMES = {"type": "array", "items": {"type": "string"}}

SOURCE: dict[str, Any] = {
    "type": "object",
    "description": "one source of the head's queries or keys, its share of the head's margin on this side",
    "required": ["source", "kind", "share"],
    "properties": {
        "source": {"type": "string", "description": "embed, LjHm, mlpj or bias"},
        "kind": {"enum": ["embed", "head", "mlp", "bias"]},
        "role": {"type": "string", "description": "a head source's role in this run (else empty)"},
        "share": {
            "type": ["number", "null"],
            "description": "its share of the head's margin on this side (negative: it works against "
            "the head's choice); null where the head is unresolved",
        },
        "ci_low": {**_NUMBER_OR_NULL, "description": "95% bootstrap interval over windows, low end"},
        "ci_high": {**_NUMBER_OR_NULL, "description": "its high end (not below ci_low)"},
        "composition": {
            **_NUMBER_OR_NULL,
            "description": "a head source's weight-only K- (key side) or Q- (query side) composition score",
        },
    },
}
RECONSTRUCTED: dict[str, Any] = {
    "type": "object",
    "description": "the head's attention rebuilt from its top k sources each side (the rest at their "
    "means): explained, the mean over rows of sum_k min(A, rebuilt), in [0, 1]",
    "required": ["k", "explained"],
    "properties": {
        "k": _COUNT,
        "explained": {"type": "number", "minimum": 0},
        "ci_low": {**_NUMBER_OR_NULL, "minimum": 0},
        "ci_high": {**_NUMBER_OR_NULL, "minimum": 0},
    },
}
UNRESOLVED: dict[str, Any] = {
    "type": ["string", "null"],
    "description": "null: the margin is resolved and split; else why it is not (then every share and "
    "interval is null, and pairs and reconstructed are empty). Absent: null",
}
_EXAMPLE = {
    "type": "object",
    "description": "the query with the largest margin, its most-attended keys and their scores split "
    "by the head's top key sources",
    "required": ["query", "token", "margin", "keys"],
    "properties": {
        "query": _COUNT,
        "token": {"type": "string"},
        "margin": {"type": "number"},
        "mean_score": {"type": "number", "description": "the mean score over the visible keys"},
        "keys": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["position", "token", "attention", "score", "parts", "rest"],
                "properties": {
                    "position": _COUNT,
                    "token": {"type": "string"},
                    "attention": {"type": "number", "minimum": 0, "maximum": 1},
                    "score": {"type": "number"},
                    "parts": {
                        "type": "object",
                        "description": "by source (the same sources for every key)",
                        "additionalProperties": {"type": "number"},
                    },
                    "rest": {"type": "number", "description": "the score less its parts"},
                },
            },
        },
    },
}
HEAD: dict[str, Any] = {
    "type": "object",
    "description": "one head: each source's share of its margin, key side and query side; each head "
    "once, inside the result's layout",
    "required": ["layer", "head", "margin", "key", "query"],
    "properties": {
        "layer": _COUNT,
        "head": _COUNT,
        "kv_group": _COUNT,
        "role": {"type": "string", "description": "the head's role in this run (else empty)"},
        "margin": {
            "type": "number",
            "description": "per row: sum_k (A - 1/n) s, attention-weighted score minus the mean score; "
            "above 0 (and not below resolution) where the head is resolved",
        },
        "resolution": {
            "type": "number",
            "minimum": 0,
            "description": "per row: the margin's rounding bound; a head is resolved above it",
        },
        "unresolved": UNRESOLVED,
        "windows": {"type": "integer", "minimum": 1, "description": "evaluation windows it was read in"},
        "key": {
            "type": "array",
            "items": SOURCE,
            "description": "every source, by |share|; a resolved head's shares sum to 1 (to 1e-4)",
        },
        "query": {"type": "array", "items": SOURCE, "description": "the same, query side"},
        "top_fit": {
            "type": "object",
            "description": "the top sources each side on the fit split (what the pairs and the "
            "reconstruction keep)",
            "properties": {"key": _NAMES, "query": _NAMES},
        },
        "pairs": {
            "type": "array",
            "description": "the top (query source, key source) pairs' shares of the margin",
            "items": {
                "type": "object",
                "required": ["query", "key", "share"],
                "properties": {
                    "query": {"type": "string"},
                    "key": {"type": "string"},
                    "share": {"type": "number"},
                },
            },
        },
        "example": _EXAMPLE,
        "reconstructed": {"type": "array", "items": RECONSTRUCTED},
    },
}


def json_schema() -> dict[str, Any]:
    """The qk block's JSON Schema (draft 2020-12, the part :mod:`headscope.core.schemacheck` reads)."""
    return {
        "type": "object",
        "description": f"headscope qk's decomposition (version {VERSION}): per head, each source's share "
        "of its margin (see docs/analyses/qk.md)",
        "required": ["version", "heads"],
        "properties": {
            "version": {
                "type": "integer",
                "const": VERSION,
                "description": "a higher one needs a newer headscope",
            },
            "data": {"type": "string", "description": "what was read"},
            "windows": {
                "type": "object",
                "description": "windows read: fit (ranks the sources), eval (measures them)",
                "properties": {"fit": _COUNT, "eval": _COUNT},
            },
            "rows_per_window": {"type": ["integer", "null"], "minimum": 0},
            "reconstruct_k": {"type": "array", "items": _COUNT},
            "check": {
                "type": "object",
                "description": "the decomposition's numeric checks on this run",
                "properties": {
                    "score_error": {"type": "number", "minimum": 0},
                    "attention_error": {"type": "number", "minimum": 0},
                    "score_tolerance": {"type": "number", "minimum": 0},
                },
            },
            "heads": {"type": "array", "items": HEAD},
        },
    }


# --- reading ------------------------------------------------------------------------------------------


def check_qk_block(data: Any, source: str = "result", layout: tuple[int, int, int] | None = None) -> None:
    """Refuse a qk block that does not fit :func:`json_schema` or its invariants (the module's
    docstring), in one line naming ``source`` and the JSON path (``qk.heads[3].key[0].share``).

    ``layout``: (layers, heads, kv_heads) of the model, where known; every head must lie inside it."""
    try:
        qk_problems(data, layout)
    except schemacheck.SchemaProblem as problem:
        where, hint = located(problem)
        raise InputError(f"{source}: {where}: {problem.problem}", hint=hint) from None


def located(problem: schemacheck.SchemaProblem) -> tuple[str, str]:
    """A problem :func:`qk_problems` raised: its JSON path in the result (``qk.heads[3]``) and the
    hint that goes with it (upgrade for a newer block, else give the file as written)."""
    where = "qk" if problem.where == "the document" else f"qk.{problem.where}"
    return where, (UPGRADE if isinstance(problem, NewerBlock) else QK_HINT)


class NewerBlock(schemacheck.SchemaProblem):
    """A block of a version newer than this headscope reads."""


def qk_problems(data: Any, layout: tuple[int, int, int] | None = None) -> None:
    """:func:`check_qk_block`'s checks, raising :class:`~headscope.core.schemacheck.SchemaProblem`
    at the first, its path inside the block (``heads[3].key[0].share``)."""
    opening(data, "qk", VERSION, json_schema())
    heads_problems(data["heads"], layout)


def opening(data: Any, name: str, version: int, schema: dict[str, Any]) -> None:
    """What every analysis block is checked for first (qk's, graph's): an object, of a version this
    headscope reads (:class:`NewerBlock` otherwise), fitting its JSON Schema."""
    if not isinstance(data, dict):
        raise schemacheck.SchemaProblem(
            "the document", f"expected an object ({name}'s block), got {_shown(data)}"
        )
    found = data.get("version")
    if isinstance(found, int) and not isinstance(found, bool) and found > version:
        raise NewerBlock(
            "version", f"{found}: written by a newer headscope (this one reads version {version})"
        )
    schemacheck.check(schema, data)


def heads_problems(
    heads: list[dict[str, Any]], layout: tuple[int, int, int] | None = None, signed: bool = False
) -> None:
    """A block's heads (fitted to :data:`HEAD`): each once, inside ``layout``, each explanation's
    invariants (:func:`explanation_problems`) and its example's. ``signed``: see there (graph's
    blocks read with its rules too: :mod:`headscope.analyses.graph_block`)."""
    seen: dict[tuple[int, int], int] = {}
    for index, entry in enumerate(heads):
        where = f"heads[{index}]"
        key = (entry["layer"], entry["head"])
        if layout is not None:
            _inside(where, entry, layout)
        if key in seen:
            raise schemacheck.SchemaProblem(
                where, f"L{key[0]}H{key[1]} again (heads[{seen[key]}]): each head appears once"
            )
        seen[key] = index
        explanation_problems(where, entry, every_source=True, signed=signed)
        _example_problems(f"{where}.example", entry.get("example"))


def explanation_problems(where: str, entry: dict[str, Any], every_source: bool, signed: bool = False) -> None:
    """What a schema cannot say about one head's explanation (a qk head, or an atlas head's ``why``,
    already fitted to :data:`SOURCE` and :data:`RECONSTRUCTED`): the module's invariants.
    ``every_source``: the sides list every source, so a resolved head's shares sum to 1.
    ``signed``: the margin is a contrast (``graph --data``: the answer's keys against the
    distractor's, ``Σ_k w_k s(q,k)`` with signed weights), which may have either sign; a resolved
    one's size is above 0 and not below its resolution (qk's ``_unresolved(signed=True)``)."""
    unresolved = entry.get("unresolved")
    if unresolved is not None:
        if not unresolved.strip():
            raise schemacheck.SchemaProblem(
                f"{where}.unresolved",
                "expected null or the reason the head is unresolved, got an empty string",
            )
        for side in SIDES:
            null_side_problems(
                f"{where}.{side}",
                entry[side],
                "on an unresolved head: its margin is not split, so every share and interval is null",
            )
        for name in ("pairs", "reconstructed"):
            if entry.get(name):
                raise schemacheck.SchemaProblem(
                    f"{where}.{name}",
                    f"{_shown(entry[name])} on an unresolved head: fractions of a margin that is not "
                    "split (expected none)",
                )
        return
    margin = entry["margin"]
    size = abs(margin) if signed else margin
    if size <= 0:
        raise schemacheck.SchemaProblem(
            f"{where}.margin",
            f"{_shown(margin)} on a resolved head (no unresolved reason): "
            + (
                "a resolved contrast is away from 0 (its size is above its float rounding)"
                if signed
                else "the margin of a head that chooses is above 0 (softmax weighs the higher scores more)"
            ),
        )
    resolution = entry.get("resolution")
    if resolution is not None and size < resolution:
        raise schemacheck.SchemaProblem(
            f"{where}.margin",
            f"{_shown(margin)} is {'in size ' if signed else ''}below the head's resolution "
            f"{_shown(resolution)}, yet the head is resolved (no unresolved reason)",
        )
    for side in SIDES:
        side_problems(f"{where}.{side}", entry[side], every_source)
    for index, item in enumerate(entry.get("reconstructed") or []):
        at = f"{where}.reconstructed[{index}]"
        for name in ("explained", "ci_low", "ci_high"):
            value = item.get(name)
            if value is not None and value > 1 + EXPLAINED_SLACK:
                raise schemacheck.SchemaProblem(
                    f"{at}.{name}",
                    f"{_shown(value)} is above 1: the rebuilt attention's overlap with the head's own "
                    "(sum_k min(A, rebuilt)) is at most 1",
                )
        _interval(at, item)


def side_problems(
    where: str,
    items: list[dict[str, Any]],
    every_source: bool,
    resolved: str = "a resolved head (no unresolved reason)",
) -> None:
    """A resolved side (``where``: ``heads[3].key``): every share given, each interval ordered, and,
    where ``every_source`` is listed, the shares summing to 1 (:func:`_sum_to_one`)."""
    shares = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]"
        if item["share"] is None:
            raise schemacheck.SchemaProblem(f"{at}.share", f"null on {resolved}: expected its share")
        shares.append(item["share"])
        _interval(at, item)
    if every_source:
        _sum_to_one(where, shares)


def null_side_problems(where: str, items: list[dict[str, Any]], why: str) -> None:
    """An unresolved side: every ``share``, ``ci_low`` and ``ci_high`` null (``why`` ends the message)."""
    for index, item in enumerate(items):
        for name in ("share", "ci_low", "ci_high"):
            if item.get(name) is not None:
                raise schemacheck.SchemaProblem(f"{where}[{index}].{name}", f"{_shown(item[name])} {why}")


def _sum_to_one(where: str, shares: list[float]) -> None:

    total = math.fsum(shares)
    slack = SCORE_TOLERANCE * max(1.0, math.fsum(abs(share) for share in shares))
    if not abs(total - 1.0) <= slack:
        raise schemacheck.SchemaProblem(
            where,
            f"the shares sum to {total:.9g}, not 1 (to {slack:.2g}): a side's shares split the head's "
            "margin; a share was changed, or a source dropped",
        )


def _interval(where: str, item: dict[str, Any]) -> None:
    low, high = item.get("ci_low"), item.get("ci_high")
    if low is not None and high is not None and low > high:
        raise schemacheck.SchemaProblem(
            f"{where}.ci_low", f"{_shown(low)} is above ci_high {_shown(high)}: an interval's low end is not"
        )


def _inside(where: str, entry: dict[str, Any], layout: tuple[int, int, int]) -> None:
    layers, heads, kv_heads = layout
    for name, size, what in (
        ("layer", layers, "layers"),
        ("head", heads, "heads"),
        ("kv_group", kv_heads, "key/value heads"),
    ):
        value = entry.get(name)
        if value is not None and value >= size:
            raise schemacheck.SchemaProblem(
                f"{where}.{name}",
                f"{value} is outside the model's {size} {what} (layout): the block does not fit the "
                "model it names",
            )


def _example_problems(where: str, example: dict[str, Any] | None) -> None:
    if not example or not example["keys"]:
        return
    names = set(example["keys"][0]["parts"])
    for index, key in enumerate(example["keys"][1:], 1):
        if set(key["parts"]) != names:
            raise schemacheck.SchemaProblem(
                f"{where}.keys[{index}].parts",
                f"splits the score over {sorted(key['parts'])}, not the sources keys[0] names "
                f"({sorted(names)}): every key is split over the head's same top sources",
            )


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object of {len(value)} key{'' if len(value) == 1 else 's'}"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"
