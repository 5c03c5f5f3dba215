"""The data an HTML report embeds: the verdict of a scan (or any analysis) as one JSON document.

Built from a live :class:`~headscope.analyses.Report` (``scan --html``) or from a saved result
(``scan --format json`` output or a sweep store, read by :mod:`headscope.sweeps.results`). The
attention heatmaps of three small examples (English prose, repeated random tokens, a Chinese
sentence) are computed by :mod:`headscope.extend.examples` when the report is built, and embedded
here as they come, one byte per weight.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from pathlib import PurePath
from typing import Any

import pandas as pd

from headscope import __version__

SCHEMA = "headscope-report/1"


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def _tables(rows: pd.DataFrame, sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from headscope.verdicts.roles import role_spec

    out = []
    keys = ["data", "detector", "relation", "direction"]
    summaries = {tuple(s.get(k, "") for k in keys): s for s in sections}
    for index, (group, part) in enumerate(rows.groupby(keys, sort=False)):
        section = summaries.get(tuple(group), {})
        data, detector, relation, direction = group
        title = " · ".join(p for p in (data, detector, relation, direction) if p)
        # A signed score (a share of the logit difference, an indirect effect) draws on a ± axis.
        spec = role_spec(detector, relation)
        signed = spec is not None and spec.kind == "signed"
        part = part.sort_values(["layer", "head"])
        out.append(
            {
                "id": f"t{index}",
                "title": title,
                "data": data,
                "detector": detector,
                "relation": relation,
                "direction": direction,
                "summary": section.get("summary") or section.get("description") or "",
                "baseline": _number(section.get("baseline")),
                "signed": signed,
                "rows": [
                    {
                        "layer": int(r.layer),
                        "head": int(r.head),
                        "kv_group": int(r.kv_group),
                        "score": _number(r.score),
                        "baseline": _number(r.baseline),
                        "ci_low": _number(r.ci_low),
                        "ci_high": _number(r.ci_high),
                        "n": int(r.n) if _number(r.n) is not None else 0,
                        "rank": int(r.rank) if _number(r.rank) is not None else 0,
                        "role": r.role if isinstance(r.role, str) else "",
                    }
                    for r in part.itertuples()
                ],
            }
        )
    return out


def _heads(
    rows: pd.DataFrame, roles: list[dict[str, Any]], tables: list[dict[str, Any]], layers: int, heads: int
) -> list[dict[str, Any]]:
    strongest = {(int(r["layer"]), int(r["head"])): r for r in roles}
    table_of = {(t["data"], t["detector"], t["relation"], t["direction"]): t["id"] for t in tables}
    kv = {(int(r.layer), int(r.head)): int(r.kv_group) for r in rows.itertuples()}
    held = (
        rows[rows["role"].fillna("") != ""]
        .groupby(["layer", "head"])["role"]
        .apply(lambda s: list(dict.fromkeys(s)))
    )
    out = []
    for layer in range(layers):
        for head in range(heads):
            best = strongest.get((layer, head), {})
            role = best.get("role") or ""
            all_roles = list(held.get((layer, head), []))
            key = tuple(best.get(k) or "" for k in ("data", "detector", "relation", "direction"))
            out.append(
                {
                    "layer": layer,
                    "head": head,
                    "kv_group": kv.get((layer, head), 0),
                    "role": role,
                    "secondary": [r for r in all_roles if r != role],
                    "score": _number(best.get("score")) if role else None,
                    "ci_low": _number(best.get("ci_low")) if role else None,
                    "ci_high": _number(best.get("ci_high")) if role else None,
                    "baseline": _number(best.get("baseline")) if role else None,
                    "table": table_of.get(key) if role else None,
                }
            )
    return out


def _summaries(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Extra results as plain tables: --verify, circuit checks, copy loss, model-level outcomes."""
    out = []
    loss = result.get("copy_loss")
    if loss:
        out.append(
            {
                "title": "next-token loss by copy of the repeated sequence",
                "columns": ["copy", "mean loss (nats)", "tokens"],
                "rows": [
                    [i + 1, v, t]
                    for i, (v, t) in enumerate(zip(loss["per_copy"], loss["tokens_per_copy"], strict=False))
                ],
            }
        )
    for key, title in (
        ("verification", "--verify: ablation of each table's top heads"),
        ("circuit_verification", "--verify: circuit checks"),
    ):
        items = result.get(key)
        if isinstance(items, list) and items:
            columns = sorted({k for item in items for k in item if not isinstance(item.get(k), (dict, list))})
            out.append(
                {
                    "title": title,
                    "columns": columns,
                    "rows": [[_cell(item.get(c)) for c in columns] for item in items],
                }
            )
    for data, outcome in (result.get("outcomes") or {}).items():
        if isinstance(outcome, dict):
            flat = {k: v for k, v in outcome.items() if not isinstance(v, (dict, list))}
            if flat:
                out.append(
                    {
                        "title": f"{data}: model-level result",
                        "columns": list(flat),
                        "rows": [[_cell(v) for v in flat.values()]],
                    }
                )
    return out


def _evaluation(value: Any) -> dict[str, float | None] | None:
    if not isinstance(value, dict):
        return None
    return {k: _number(value.get(k)) for k in ("accuracy", "answer_loss", "text_loss")}


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, (int, str)) or value is None:
        return value
    return str(value)


# A saved row may leave out any column but detector, layer, head and score (the result schema).
_ROW_DEFAULTS: dict[str, Any] = {
    "model": "",
    "relation": "",
    "direction": "",
    "data": "",
    "role": "",
    "kv_group": 0,
    "baseline": None,
    "ci_low": None,
    "ci_high": None,
    "n": None,
    "rank": None,
}


def _window(value: Any) -> int | None:
    return None if value is None else int(value)


def _rows(records: list[dict[str, Any]]) -> pd.DataFrame:
    rows = pd.DataFrame([{**_ROW_DEFAULTS, **record} for record in records])
    for column in ("model", "data", "detector", "relation", "direction", "role"):
        rows[column] = rows[column].fillna("").astype(str)
    rows["kv_group"] = rows["kv_group"].fillna(0).astype(int)
    for column in ("layer", "head"):
        rows[column] = rows[column].astype(int)
    for column in ("score", "baseline", "ci_low", "ci_high", "n", "rank"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce").astype(float)
    return rows


def build(
    result: dict[str, Any],
    *,
    layout: dict[str, Any] | None = None,
    examples: list[dict[str, Any]] | None = None,
    command: str = "",
) -> dict[str, Any]:
    """The report's data from a result dictionary (``report_json`` output)."""
    from headscope.verdicts.roles import RESTING_ROLE, roles_from_rows, spec_for_label

    rows = _rows(result["rows"])
    layout = {k: v for k, v in (layout or result.get("layout") or {}).items() if v is not None}
    # The role map has the size of the model the result names (its layout), not of its largest
    # row: Result.from_json has checked that every row lies inside it.
    layers = int(layout.get("layers", int(rows["layer"].max()) + 1))
    heads = int(layout.get("heads", int(rows["head"].max()) + 1))
    kv_heads = int(layout.get("kv_heads", int(rows["kv_group"].max()) + 1))
    local = list((result.get("layers") or {}).get("local") or layout.get("local_layers") or [])
    model = {
        "name": str(result["model"]),
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "group_size": int(layout.get("group_size", max(1, heads // max(1, kv_heads)))),
        "head_dim": int(layout.get("head_dim", 0)),
        "d_model": int(layout.get("d_model", 0)),
        "local_layers": [int(i) for i in local],
        "global_layers": [i for i in range(layers) if i not in local],
        "window": _window((result.get("layers") or {}).get("window", layout.get("window"))),
        "causal": bool(layout.get("causal", True)),
    }
    sections = [
        {**s, **{k: s.get(k) or "" for k in ("data", "detector", "relation", "direction")}}
        for s in result.get("sections") or []
    ]
    tables = _tables(rows, sections)
    roles = result.get("roles")
    if roles is None:  # a result without its role table: each head's strongest row
        roles = [r for r in roles_from_rows(rows).to_dict(orient="records") if r["role"]]
    used = list(dict.fromkeys(r["role"] for r in roles if r.get("role")))
    held = list(dict.fromkeys(rows.loc[rows["role"] != "", "role"]))
    labels = list(dict.fromkeys([*used, *held]))
    labels.sort(key=lambda label: (label == RESTING_ROLE, label))
    datasets = list(
        {s["data"]: {"data": s["data"], "description": s.get("description") or ""} for s in sections}.values()
    )
    built = {
        "schema": SCHEMA,
        "title": f"headscope {result.get('command', '')} · {model['name']}",
        "model": model,
        "headscope": str(result.get("headscope", __version__)),
        "command": command or f"headscope {result.get('command', '')} {model['name']}",
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "datasets": datasets,
        "roles": [
            {"label": label, "meaning": spec.meaning, "color": spec.color}
            for label, spec in {label: spec_for_label(label) for label in labels}.items()
        ],
        "heads": _heads(rows, roles, tables, layers, heads),
        "tables": tables,
        "summaries": _summaries(result),
        "notes": [str(n) for n in result.get("notes") or []],
        "examples": examples or [],
    }
    return built


def python_call(analysis: str, model: str, options: Any = None) -> str:
    """The Python call that made a result, for its report's "command": ``hs.scan('toy',
    resamples=0)`` with the options that differ from their defaults; a result read back from JSON
    does not know its options (``Result.from_json(...)``)."""
    if options is None or not dataclasses.is_dataclass(options):
        return f"hs.Result.from_json(…) (a saved {analysis} result of {model})"
    given = [repr(model)]
    for field in dataclasses.fields(options):
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(options, field.name)
        try:
            same = bool(value == default)
        except (TypeError, ValueError):  # a value that does not compare to a plain bool
            same = False
        if not same:
            shown = str(value) if isinstance(value, PurePath) else value
            given.append(f"{field.name}={shown!r}")
    return f"hs.{analysis.replace('-', '_')}({', '.join(given)})"


def layout_of(loaded: Any) -> dict[str, Any]:
    from headscope.outputs.report import layout_json

    return {**layout_json(loaded.layout), "causal": bool(loaded.is_causal)}
