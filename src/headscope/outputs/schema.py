"""The result document (``headscope-result/1``), declared once: what ``Result.to_json``, ``--format
json`` and a sweep store's run hold.

From the one declaration below (:data:`RESULT`: every field, its kind, whether it is required, what it
means):

* :func:`report_json` writes the document (:func:`document` puts the format and the writer first);
* :func:`check_result` reads it back: a document that does not fit ends in one line naming the source
  and the JSON path (``rows[12].layer``), never deep inside pandas or the report;
* :func:`json_schema` exports it as a JSON Schema (draft 2020-12), printed into
  docs/reference/outputs.md by ``python -m headscope.outputs.schema``.

jsonschema is not a dependency of headscope (it only comes with the dev tools), so the reader walks
the declaration itself. What a JSON Schema cannot say (every row inside the stated layout, each head
once per table, the versioning rule) is checked after the walk, and said in the schema's
descriptions. Each analysis' own records (its checks, its outcomes) stay open objects here: their
analysis owns them; the atlas has a schema of its own, referenced by its ``$id``; qk's block is
declared by qk (:mod:`headscope.analyses.qk_block`), inlined in the JSON Schema, and read with its
rules (each head inside the layout, shares and margins as the decomposition guarantees them); so is
graph's (:mod:`headscope.analyses.graph_block`: qk's head rules, a value side, and its edges as
copies of the heads' qualifying sources).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from headscope.errors import InputError

RESULT_FORMAT = 1
RESULT_SCHEMA = f"headscope-result/{RESULT_FORMAT}"
SCHEMA_ID = f"https://headscope.invalid/schemas/headscope-result-{RESULT_FORMAT}.json"
# More heads than any model has: a layout beyond this is a damaged file, not a model to draw.
MAX_HEADS = 1_000_000
SHORT = 60
UPGRADE = "upgrade headscope to read it: pip install -U headscope"
HINT = "give the file as headscope wrote it (--format json), or rerun the analysis"


# --- messages -----------------------------------------------------------------------------------------


def elide(text: str, limit: int = SHORT) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was, so a message stays one short line."""
    text = " ".join(text.split())  # no line breaks inside a message
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def shown(value: Any) -> str:
    """A value for a message: JSON-like, short, one line."""
    if isinstance(value, dict):
        return f"an object of {len(value)} key{'' if len(value) == 1 else 's'}"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        digits = len(str(abs(value))) if abs(value) < 10**4000 else 4000
        return str(value) if digits <= 20 else f"an integer of {digits}+ digits"
    if isinstance(value, str):
        return elide(json.dumps(value, ensure_ascii=False))
    return elide(repr(value))


class Refusal(Exception):
    """One problem at one JSON path; ``check_result`` turns it into an InputError naming the file."""

    def __init__(self, where: str, problem: str, hint: str | None = HINT) -> None:
        super().__init__(where, problem)
        self.where = where
        self.problem = problem
        self.hint = hint


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


# --- kinds of value: each says what it accepts (to read) and how a JSON Schema says so (to export) ------


def _is_int(value: Any) -> bool:
    # bool is an int subclass but not a JSON integer; 3.0 is one (pandas writes counts next to NaN so)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


class Kind:
    """A kind of JSON value: ``problem(value)`` says what is wrong with a value (None: it fits),
    ``check`` walks into it naming JSON paths, ``schema()`` is its JSON Schema."""

    def problem(self, value: Any) -> str | None:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def check(self, where: str, value: Any) -> None:
        problem = self.problem(value)
        if problem is not None:
            raise Refusal(where or "the document", f"{problem}, got {shown(value)}")
        self.inside(where, value)

    def inside(self, where: str, value: Any) -> None:
        """The parts of a value that fits this kind (a list's items, an object's fields)."""


class Scalar(Kind):
    """A kind with nothing inside: a string, a number, or an object another module owns."""

    def __init__(self, problem: Callable[[Any], str | None], schema: Callable[[], dict[str, Any]]) -> None:
        self._problem = problem
        self._schema = schema

    def problem(self, value: Any) -> str | None:
        return self._problem(value)

    def schema(self) -> dict[str, Any]:
        return self._schema()


def _scalar(problem: Callable[[Any], str | None], **schema: Any) -> Kind:
    return Scalar(problem, lambda: dict(schema))


STRING = _scalar(lambda v: None if isinstance(v, str) else "expected a string", type="string")
TEXT = _scalar(
    lambda v: (
        "expected a string"
        if not isinstance(v, str)
        else None
        if v.strip()
        else "expected a non-empty string"
    ),
    type="string",
    pattern=r"\S",
)
COUNT = _scalar(
    lambda v: None if _is_int(v) and v >= 0 else "expected a non-negative integer", type="integer", minimum=0
)
POSITIVE = _scalar(
    lambda v: None if _is_int(v) and v >= 1 else "expected a positive integer", type="integer", minimum=1
)
NUMBER = _scalar(lambda v: None if _finite(v) else "expected a finite number", type="number")
BOOLEAN = _scalar(lambda v: None if isinstance(v, bool) else "expected true or false", type="boolean")


def _object_problem(value: Any) -> str | None:
    return None if isinstance(value, dict) else "expected an object"


def open_object(ref: Callable[[], str] | None = None) -> Kind:
    """An object whose fields another part of headscope owns (an analysis' record), or, with ``ref``,
    one with a JSON Schema of its own (its ``$id``)."""
    return Scalar(_object_problem, lambda: {"$ref": ref()} if ref is not None else {"type": "object"})


class Nullable(Kind):
    """``kind``, or null (the field was not measured, or a NaN)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None
        problem = self.kind.problem(value)
        return None if problem is None else f"{problem} or null"

    def inside(self, where: str, value: Any) -> None:
        if value is not None:
            self.kind.inside(where, value)

    def schema(self) -> dict[str, Any]:
        inner = self.kind.schema()
        kind = inner.get("type")
        if isinstance(kind, str) and "$ref" not in inner:
            return {**inner, "type": [kind, "null"]}
        return {"anyOf": [inner, {"type": "null"}]}


class ListOf(Kind):
    """A list of ``item``s; ``empty``: the message when it may not be empty."""

    def __init__(self, item: Kind, empty: str | None = None) -> None:
        self.item = item
        self.empty = empty

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, list) else "expected a list"

    def inside(self, where: str, value: Any) -> None:
        if self.empty is not None and not value:
            raise Refusal(where, self.empty)
        for index, item in enumerate(value):
            self.item.check(f"{where}[{index}]", item)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema()}
        if self.empty is not None:
            out["minItems"] = 1
        return out


class MapOf(Kind):
    """An object whose keys are names (a view, a data set) and whose values are each a ``value``."""

    def __init__(self, value: Kind) -> None:
        self.value = value

    def problem(self, value: Any) -> str | None:
        return _object_problem(value)

    def inside(self, where: str, value: Any) -> None:
        for key, item in value.items():
            self.value.check(_key(where, str(key)), item)

    def schema(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.value.schema()}


class Records(Kind):
    """A check as the JSON holds it (each analysis owns its fields): an object, a list of objects, or null."""

    def problem(self, value: Any) -> str | None:
        if value is None or isinstance(value, dict):
            return None
        if isinstance(value, list) and all(isinstance(item, dict) for item in value):
            return None
        return "expected an object, a list of objects, or null"

    def schema(self) -> dict[str, Any]:
        return {"type": ["object", "array", "null"], "items": {"type": "object"}}


@dataclass(frozen=True)
class Field:
    kind: Kind
    required: bool = False
    description: str = ""


class Obj(Kind):
    """An object with declared fields. Keys it does not declare are ignored when read (a newer
    headscope of the same format only adds keys) and allowed by the JSON Schema."""

    def __init__(self, fields: dict[str, Field], description: str = "") -> None:
        self.fields = fields
        self.description = description

    def problem(self, value: Any) -> str | None:
        return _object_problem(value)

    def inside(self, where: str, value: Any) -> None:
        for key, spec in self.fields.items():
            if key not in value:
                if spec.required:
                    raise Refusal(_key(where, key), "missing (a required field)")
                continue
            spec.kind.check(_key(where, key), value[key])

    def schema(self) -> dict[str, Any]:
        properties = {}
        for key, spec in self.fields.items():
            schema = spec.kind.schema()
            properties[key] = {**schema, "description": spec.description} if spec.description else schema
        out: dict[str, Any] = {"type": "object"}
        if self.description:
            out["description"] = self.description
        required = [key for key, spec in self.fields.items() if spec.required]
        if required:
            out["required"] = required
        out["properties"] = properties
        return out


def _atlas_id() -> str:
    from headscope.analyses.describe.atlas import json_schema as atlas_schema

    return str(atlas_schema()["$id"])


def _qk_schema() -> dict[str, Any]:
    from headscope.analyses.qk_block import json_schema as qk_schema

    return qk_schema()


def _graph_schema() -> dict[str, Any]:
    from headscope.analyses.graph_block import json_schema as graph_schema

    return graph_schema()


# --- the declaration --------------------------------------------------------------------------------

_OPT_STRING = Nullable(STRING)
_OPT_COUNT = Nullable(COUNT)
_OPT_NUMBER = Nullable(NUMBER)
_NAMES = {
    "data": Field(_OPT_STRING, description="the prompt set the row was scored on"),
    "relation": Field(_OPT_STRING, description="syntax: the UD relation; coref: coref; else empty"),
    "direction": Field(_OPT_STRING, description="dep->head, head->dep, pronoun->antecedent…; else empty"),
}
_INTERVAL = {
    "baseline": Field(_OPT_NUMBER, description="the table's baseline for the head's layer"),
    "ci_low": Field(_OPT_NUMBER, description="95% bootstrap interval, low end (null: none)"),
    "ci_high": Field(_OPT_NUMBER, description="95% bootstrap interval, high end (null: none)"),
}
_INSIDE = "layer < layout.layers, head < layout.heads, kv_group < layout.kv_heads (checked when read)"

LAYOUT = Obj(
    {
        "layers": Field(POSITIVE, True),
        "heads": Field(POSITIVE, True, "query heads per layer; layers × heads is at most 1000000"),
        "kv_heads": Field(Nullable(POSITIVE), description="key/value heads per layer, at most heads"),
        "group_size": Field(Nullable(POSITIVE), description="query heads per key/value head"),
        "head_dim": Field(_OPT_COUNT),
        "d_model": Field(_OPT_COUNT),
        "local_layers": Field(Nullable(ListOf(COUNT)), description="sliding-window layers (< layers)"),
        "window": Field(_OPT_COUNT, description="the sliding window, in tokens"),
        "causal": Field(Nullable(BOOLEAN)),
    },
    "the model's attention layout: every row and role lies inside it",
)
ROW = Obj(
    {
        "model": Field(_OPT_STRING, description="the model's name (in a sweep, the checkpoint's label)"),
        "detector": Field(TEXT, True, "the detector or analysis table"),
        "relation": _NAMES["relation"],
        "direction": _NAMES["direction"],
        "layer": Field(COUNT, True),
        "head": Field(COUNT, True, "the query head"),
        "kv_group": Field(_OPT_COUNT, description="the key/value head the query head reads"),
        "score": Field(_OPT_NUMBER, True, "the head's score (null: not measured)"),
        **_INTERVAL,
        "n": Field(_OPT_COUNT, description="counted positions (or arcs, examples, tokens, pairs)"),
        "rank": Field(Nullable(POSITIVE), description="1 for the highest score within its table"),
        "role": Field(_OPT_STRING, description="the row's role label when the head qualifies"),
        "data": _NAMES["data"],
    },
    f"one head in one table: the CSV's columns; {_INSIDE}; each (detector, relation, direction, "
    "data, layer, head) appears once",
)
ROLE = Obj(
    {
        "model": Field(_OPT_STRING),
        "layer": Field(COUNT, True),
        "head": Field(COUNT, True),
        "kv_group": Field(_OPT_COUNT),
        "role": Field(_OPT_STRING, description="the head's strongest role (empty: none)"),
        "n_roles": Field(_OPT_COUNT, description="how many roles the head qualified for"),
        "secondary": Field(_OPT_STRING, description="the other roles, space-separated"),
        "data": _NAMES["data"],
        "detector": Field(_OPT_STRING, description="the table behind the role"),
        "relation": _NAMES["relation"],
        "direction": _NAMES["direction"],
        "score": Field(_OPT_NUMBER),
        **_INTERVAL,
        "p_adj": Field(_OPT_NUMBER, description="the adjusted p-value behind the role"),
        "n": Field(_OPT_COUNT),
    },
    f"one head's role (the --roles-csv columns); {_INSIDE}; each head appears once",
)
SECTION = Obj(
    {
        "detector": Field(TEXT, True),
        **_NAMES,
        "summary": Field(_OPT_STRING),
        "description": Field(_OPT_STRING, description="what the data is, for people"),
        "n": Field(_OPT_COUNT),
        "n_examples": Field(_OPT_COUNT),
        "baseline": Field(_OPT_NUMBER),
        "baseline_kind": Field(_OPT_STRING),
        "baseline_label": Field(_OPT_STRING),
        "extras": Field(Nullable(MapOf(_OPT_NUMBER)), description="more baselines, by name (coref)"),
        "baseline_range": Field(
            Nullable(ListOf(_OPT_NUMBER)), description="lowest and highest baseline over layers"
        ),
    },
    "what one table is about: its data, detector, relation and direction, and its baseline",
)
LAYERS = Obj(
    {
        "local": Field(Nullable(ListOf(COUNT)), description="sliding-window layers (< layout.layers)"),
        "global": Field(Nullable(ListOf(COUNT)), description="full-attention layers (< layout.layers)"),
        "window": Field(_OPT_COUNT),
    },
    "written when the model has sliding-window layers",
)
COPY_LOSS = Obj(
    {
        "per_copy": Field(ListOf(_OPT_NUMBER), True, "mean next-token loss per copy (nats)"),
        "tokens_per_copy": Field(ListOf(COUNT), True),
        "first": Field(_OPT_NUMBER),
        "later": Field(_OPT_NUMBER),
    },
    "induction: next-token loss by copy of the repeated sequence",
)
CONFORMANCE = Obj(
    {
        "view": Field(_OPT_STRING),
        "ok": Field(Nullable(BOOLEAN)),
        "error": Field(_OPT_NUMBER, description="largest relative error of the decomposition"),
        "reason": Field(_OPT_STRING),
        "how": Field(_OPT_STRING),
    }
)
_CHECKS = "an analysis' causal check(s), each analysis' own record"

RESULT = Obj(
    {
        "schema": Field(
            Scalar(STRING.problem, lambda: {"const": RESULT_SCHEMA}),
            description=(
                f"the format, written as {RESULT_SCHEMA}; a higher number is refused (written by a newer "
                f"headscope); a document without it is read as {RESULT_SCHEMA}"
            ),
        ),
        "headscope": Field(
            STRING,
            True,
            "the headscope version that wrote it; a newer major version is refused, a newer minor "
            "one is read with a note",
        ),
        "command": Field(TEXT, True, "the analysis (scan, induction, kv-plan…)"),
        "model": Field(STRING, True),
        "spec": Field(_OPT_STRING, description="a sweep run's model spec"),
        "capture": Field(_OPT_STRING, description="how attention was captured"),
        "sections": Field(ListOf(SECTION), True, "one per table"),
        "rows": Field(ListOf(ROW, empty="the result holds no head rows"), True, "the CSV's rows"),
        "roles": Field(Nullable(ListOf(ROLE)), description="the role map: one object per head"),
        "notes": Field(Nullable(ListOf(STRING))),
        "layout": Field(LAYOUT, True),
        "layers": Field(Nullable(LAYERS)),
        "copy_loss": Field(Nullable(COPY_LOSS)),
        "outcomes": Field(
            Nullable(MapOf(open_object())),
            description="by data set: the model-level outcome (IOI or needle accuracy…), its analysis' own record",
        ),
        "role_rule": Field(_OPT_STRING, description="the rule roles were assigned under"),
        "conformance": Field(
            Nullable(MapOf(CONFORMANCE)),
            description="by view: each attention decomposition checked on the model",
        ),
        "verification": Field(Records(), description=_CHECKS),
        "circuit_verification": Field(Records(), description=_CHECKS),
        "ablation": Field(Records(), description=_CHECKS),
        "icl": Field(Nullable(open_object()), description="icl's score and its interval, icl's own record"),
        "kv_plan": Field(
            Nullable(open_object()), description="kv-plan's plan and its evaluation, kv-plan's own record"
        ),
        "atlas": Field(
            Nullable(open_object(_atlas_id)),
            description="every head's description: headscope-atlas/1, its schema below",
        ),
        # declared by its analysis (headscope.analyses.qk_block), checked in _check like the atlas
        "qk": Field(Nullable(Scalar(_object_problem, _qk_schema))),
        # declared by its analysis (headscope.analyses.graph_block), read with qk's head rules and its own
        "graph": Field(Nullable(Scalar(_object_problem, _graph_schema))),
    },
    "a headscope result: the tidy rows and what the tables say around them. Fields not listed are an "
    "analysis' own (a plugin's) and are ignored when read.",
)


def json_schema() -> dict[str, Any]:
    """The result document's JSON Schema (draft 2020-12), as documented in docs/reference/outputs.md."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "headscope result",
        **RESULT.schema(),
    }


# --- writing ----------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """NaN and infinities become null; tuples become lists; numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-ready dicts (NaN becomes null)."""
    return json.loads(frame.to_json(orient="records", double_precision=10))


def document(*parts: dict[str, Any]) -> dict[str, Any]:
    """A result document: the format and the writing headscope first, then each part's fields in their
    order (a later part's value replaces an earlier one's), those that are None left out. A field
    :data:`RESULT` does not declare is an analysis' own."""
    from headscope import __version__

    out: dict[str, Any] = {"schema": RESULT_SCHEMA, "headscope": __version__}
    for part in parts:
        out.update((key, value) for key, value in part.items() if value is not None)
    return out


def layout_json(layout: Any) -> dict[str, Any]:
    """A HeadLayout as JSON (:data:`LAYOUT`: the result files and the HTML report)."""
    return {
        "layers": layout.n_layers,
        "heads": layout.n_heads,
        "kv_heads": layout.n_kv_heads,
        "group_size": layout.group_size,
        "head_dim": layout.head_dim,
        "d_model": layout.d_model,
        "local_layers": list(layout.local_layers),
        "window": layout.window,
    }


def _section_json(section: Any) -> dict[str, Any]:
    """A section's fields (:data:`SECTION`) without its one-line summary; extras only where there are any."""
    fields = dataclasses.asdict(section)
    del fields["summary"]
    if not fields["extras"]:
        del fields["extras"]
    return fields


def report_json(report: Any, command: str, **extra: Any) -> dict[str, Any]:
    """The machine-readable form of a report: the CSV rows plus what the tables say around them;
    ``extra``: what the analysis adds (its roles, checks, records)."""
    from headscope.verdicts.results import CSV_COLUMNS

    layout = report.layout
    loss = report.loss
    core = dict(
        command=command,
        model=report.model,
        capture=report.capture_mode,
        sections=[_section_json(s) for s in report.sections],
        rows=records(report.table[CSV_COLUMNS]),
        notes=list(report.notes),
        layout=None if layout is None else layout_json(layout),
        layers=(
            {
                "local": list(layout.local_layers),
                "global": list(layout.global_layers),
                "window": layout.window,
            }
            if layout is not None and layout.local_layers
            else None
        ),
        copy_loss=(
            None
            if loss is None
            else {
                "per_copy": loss.per_copy,
                "tokens_per_copy": loss.tokens_per_copy,
                "first": loss.first,
                "later": loss.later,
            }
        ),
        outcomes={data: outcome.to_json() for data, outcome in report.outcomes.items()} or None,
    )
    return document(core, extra)


def roles_records(report: Any) -> list[dict[str, Any]]:
    """The role map's rows (:data:`ROLE`)."""
    from headscope.verdicts.roles import ROLES_CSV_COLUMNS, head_roles

    return records(head_roles(report.table)[ROLES_CSV_COLUMNS])


# --- reading ----------------------------------------------------------------------------------------


def _version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"\s*v?(\d{1,9})(?:\.(\d{1,9}))?(?:\.(\d{1,9}))?", text)
    return None if match is None else tuple(int(g) for g in match.groups() if g is not None)


def _check_version(saved: dict[str, Any]) -> str | None:
    """The versioning rule (see ``check_result``); returns a note to keep, or None."""
    from headscope import __version__

    schema = saved.get("schema")
    if schema is not None:
        if not isinstance(schema, str):
            raise Refusal("schema", f"expected a string like {RESULT_SCHEMA!r}, got {shown(schema)}")
        match = re.fullmatch(r"headscope-result/(\d{1,9})", schema)
        if match is None:
            what = (
                "the HTML report's data, not a saved result"
                if schema.startswith("headscope-report/")
                else f"not a result format this headscope knows (it reads {RESULT_SCHEMA})"
            )
            raise Refusal("schema", f"{shown(schema)} is {what}")
        if int(match.group(1)) > RESULT_FORMAT:
            raise Refusal(
                "schema",
                f"{schema} was written by a newer headscope (this headscope {__version__} reads "
                f"{RESULT_SCHEMA})",
                hint=UPGRADE,
            )
    writer = saved.get("headscope")
    ours = _version(__version__)
    theirs = _version(writer) if isinstance(writer, str) else None
    if theirs is None or ours is None or theirs[:3] <= ours[:3]:
        return None
    if theirs[0] > ours[0]:
        raise Refusal(
            "headscope",
            f"written by headscope {elide(writer, 20)}, a newer major version than this {__version__}",
            hint=UPGRADE,
        )
    return (
        f"this result was written by headscope {elide(writer, 20)}, newer than this {__version__}: "
        f"read as {RESULT_SCHEMA}; fields this version does not know are ignored"
    )


def check_result(saved: Any, source: str = "result") -> list[str]:
    """Check a saved result against :data:`RESULT`; raise :class:`InputError` (one line: ``source``,
    the JSON path such as ``rows[12].layer``, what is wrong, what to do) at the first problem.

    Returns the notes reading it leaves (a newer writer of the same format).

    Versioning, the explicit rule:

    * ``schema``, when present, names the format: ``headscope-result/1`` is read; a higher number
      was written by a newer headscope and is refused ("upgrade headscope"); anything else is
      refused. Documents without it (every headscope so far) are ``headscope-result/1``.
    * ``headscope`` is the version that wrote the file. A newer major version is refused like a
      newer format; a newer minor or patch version is read, with a note in ``Result.notes`` and the
      report.
    * Keys this version does not know, at any level, are **ignored** (a newer headscope of the same
      format only adds keys); the known keys are checked for type, range and uniqueness.

    The document states its model's layout (``layout.layers``, ``layout.heads``): every row and
    role must lie inside it, and the report's role map has exactly that size.
    """
    try:
        return _check(saved)
    except Refusal as refusal:
        raise InputError(f"{source}: {refusal.where}: {refusal.problem}", hint=refusal.hint) from None


def _check(saved: Any) -> list[str]:
    if not isinstance(saved, dict):
        raise Refusal("the document", f"expected an object (a headscope result), got {shown(saved)}")
    notes = [note] if (note := _check_version(saved)) else []
    RESULT.check("", saved)
    if saved.get("atlas") is not None:
        # describe's atlas has a schema of its own, checked the same way: a damaged one is refused
        # here, before compare prints distances from it or the report drops its section.
        from headscope.analyses.describe.atlas import ATLAS_HINT, atlas_problems
        from headscope.core.schemacheck import SchemaProblem

        try:
            atlas_problems(saved["atlas"])
        except SchemaProblem as problem:
            where = "atlas" if problem.where == "the document" else f"atlas.{problem.where}"
            raise Refusal(where, problem.problem, hint=ATLAS_HINT) from None
    # What the declaration cannot say: the sizes agree, and each head appears once.
    layout = saved["layout"]
    layers, heads = int(layout["layers"]), int(layout["heads"])
    if layers * heads > MAX_HEADS:
        raise Refusal(
            "layout", f"{layers} layers × {heads} heads is more than any model has (at most {MAX_HEADS})"
        )
    kv_heads = int(layout.get("kv_heads") or heads)
    if kv_heads > heads:
        raise Refusal("layout.kv_heads", f"{kv_heads} key/value heads is more than the {heads} heads")
    _layer_list("layout.local_layers", layout.get("local_layers"), layers)
    for key in ("local", "global"):
        _layer_list(f"layers.{key}", (saved.get("layers") or {}).get(key), layers)
    if saved.get("qk") is not None:
        # qk's block, declared by qk: a damaged one is refused here, before the report drops its section
        from headscope.analyses.qk_block import located, qk_problems
        from headscope.core.schemacheck import SchemaProblem

        try:
            qk_problems(saved["qk"], (layers, heads, kv_heads))
        except SchemaProblem as problem:
            where, hint = located(problem)
            raise Refusal(where, problem.problem, hint=hint) from None
    if saved.get("graph") is not None:
        # graph's block, declared by graph: its heads read as qk's, its edges as copies of them
        from headscope.analyses.graph_block import graph_problems
        from headscope.analyses.graph_block import located as graph_located
        from headscope.core.schemacheck import SchemaProblem

        try:
            graph_problems(saved["graph"], (layers, heads, kv_heads))
        except SchemaProblem as problem:
            where, hint = graph_located(problem)
            raise Refusal(where, problem.problem, hint=hint) from None

    seen: dict[tuple[Any, ...], int] = {}
    for index, row in enumerate(saved["rows"]):
        where = f"rows[{index}]"
        _inside(where, row, layers, heads, kv_heads)
        key = (
            row["detector"],
            *(row.get(name) or "" for name in ("relation", "direction", "data")),
            int(row["layer"]),
            int(row["head"]),
        )
        if key in seen:
            raise Refusal(
                where,
                f"repeats rows[{seen[key]}] (detector {shown(row['detector'])}, layer {key[4]}, "
                f"head {key[5]}): each (detector, relation, direction, data, layer, head) appears once",
            )
        seen[key] = index
    heads_seen: dict[tuple[int, int], int] = {}
    for index, role in enumerate(saved.get("roles") or []):
        where = f"roles[{index}]"
        _inside(where, role, layers, heads, kv_heads)
        head_key = (int(role["layer"]), int(role["head"]))
        if head_key in heads_seen:
            raise Refusal(
                where,
                f"repeats roles[{heads_seen[head_key]}] (layer {head_key[0]}, head {head_key[1]}): "
                "each head has one role row",
            )
        heads_seen[head_key] = index
    return notes


def _layer_list(where: str, items: list[Any] | None, layers: int) -> None:
    for index, item in enumerate(items or []):
        if item >= layers:
            raise Refusal(f"{where}[{index}]", f"layer {int(item)} is outside the layout's {layers} layers")


def _inside(where: str, row: dict[str, Any], layers: int, heads: int, kv_heads: int) -> None:
    """A row's head lies inside the layout the document states (the model it names)."""
    for key, size, what in (("layer", layers, "layers"), ("head", heads, "heads")):
        if row[key] >= size:
            raise Refusal(
                f"{where}.{key}",
                f"{shown(int(row[key]))} is outside the model's {size} {what} (layout.{what}): "
                "the result does not fit the model it names",
            )
    kv_group = row.get("kv_group")
    if kv_group is not None and kv_group >= kv_heads:
        raise Refusal(
            f"{where}.kv_group", f"{shown(int(kv_group))} is outside the model's {kv_heads} key/value heads"
        )


if __name__ == "__main__":  # docs/reference/outputs.md prints it: python -m headscope.outputs.schema
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
