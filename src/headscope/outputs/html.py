"""The HTML report: one self-contained, offline page.

``render(data)`` returns a single HTML document: the stylesheet in a ``<style>``, the report data as
JSON in ``<script id="headscope-data" type="application/json">`` and the script that draws the page
from it. Nothing is loaded from the network (no fonts, no CDNs), so the file works from ``file://``
and can be mailed around. ``check_data(data)`` validates the shape the page relies on.
"""

from __future__ import annotations

import html as _html
import json
import math
import re
from contextvars import ContextVar
from importlib import resources
from typing import Any

SCHEMA = "headscope-report/1"

# The headscope command being run, as the CLI parsed it (``headscope.cli.params`` sets it while a
# command runs): the "command" a report made from the CLI records. Not sys.argv, which belongs to
# whatever program runs the CLI in-process (a test runner, a notebook). None outside a command: a
# report made from Python records the Python call (:func:`headscope.outputs.report_data.python_call`).
COMMAND_LINE: ContextVar[str | None] = ContextVar("headscope_command_line", default=None)

_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")
_MAP_KEY = re.compile(r"^\d+,\d+$")

# Field specs: name -> (allowed types, description for messages). ``None`` in the tuple allows null.
_NUM = (int, float)
_NUM_OR_NULL = (int, float, type(None))

_TOP: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "title": (str,),
    "model": (dict,),
    "headscope": (str,),
    "command": (str,),
    "created": (str,),
    "datasets": (list,),
    "roles": (list,),
    "heads": (list,),
    "tables": (list,),
    "summaries": (list,),
    "notes": (list,),
    "examples": (list,),
}
_MODEL: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "layers": (int,),
    "heads": (int,),
    "kv_heads": (int,),
    "group_size": (int,),
    "head_dim": (int,),
    "d_model": (int,),
    "local_layers": (list,),
    "global_layers": (list,),
    "window": (int, type(None)),
    "causal": (bool,),
}
_DATASET = {"data": (str,), "description": (str,)}
_ROLE = {"label": (str,), "meaning": (str,), "color": (str,)}
_HEAD: dict[str, tuple[type, ...]] = {
    "layer": (int,),
    "head": (int,),
    "kv_group": (int,),
    "role": (str,),
    "secondary": (list,),
    "score": _NUM_OR_NULL,
    "ci_low": _NUM_OR_NULL,
    "ci_high": _NUM_OR_NULL,
    "baseline": _NUM_OR_NULL,
    "table": (str, type(None)),
}
_TABLE: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "title": (str,),
    "data": (str,),
    "detector": (str,),
    "relation": (str,),
    "direction": (str,),
    "summary": (str,),
    "baseline": _NUM_OR_NULL,
    "signed": (bool,),
    "rows": (list,),
}
_ROW: dict[str, tuple[type, ...]] = {
    "layer": (int,),
    "head": (int,),
    "kv_group": (int,),
    "score": _NUM_OR_NULL,
    "baseline": _NUM_OR_NULL,
    "ci_low": _NUM_OR_NULL,
    "ci_high": _NUM_OR_NULL,
    "n": (int,),
    "rank": (int,),
    "role": (str,),
}
_SUMMARY = {"title": (str,), "columns": (list,), "rows": (list,)}
_EXAMPLE = {"name": (str,), "tokens": (list,), "maps": (dict,)}

_MAX_TOKENS = 64

# ``kv_plan`` (only in a kv-plan report): drawn here as static HTML, not by report.js.
_KV_PLAN: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "method": (str,),
    "sink": (int,),
    "recent": (int,),
    "contexts": (list,),
    "layers": (int,),
    "kv_heads": (int,),
    "candidates": (int,),
    "notes": (list,),
    "heads": (list,),
    "sparsities": (list,),
}
_KV_HEAD: dict[str, tuple[type, ...]] = {
    "layer": (int,),
    "kv_head": (int,),
    "candidate": (bool,),
    "mass": _NUM_OR_NULL,
    "retrieval": _NUM_OR_NULL,
}
_KV_SPARSITY: dict[str, tuple[type, ...]] = {
    "sparsity": _NUM_OR_NULL,
    "n_streaming": (int,),
    "streaming": (list,),
    "plan": (dict, type(None)),
    "random_mean": (dict, type(None)),
    "memory": (list,),
}
_KV_MEMORY: dict[str, tuple[type, ...]] = {
    "context": (int,),
    "saved_share": _NUM_OR_NULL,
    "reduction": _NUM_OR_NULL,
}


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _want(types: tuple[type, ...]) -> str:
    names = ["null" if t is type(None) else ("number" if t is float else t.__name__) for t in types]
    if "number" in names and "int" in names:
        names.remove("int")
    return " or ".join(dict.fromkeys(names))


def _check_value(where: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int subclass: it is only accepted where bool is asked for.
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise ValueError(f"{where}: expected {_want(types)}, got {_type_name(value)} ({value!r:.60})")


def _check_fields(where: str, obj: Any, spec: dict[str, tuple[type, ...]]) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {_type_name(obj)}")
    for key, types in spec.items():
        if key not in obj:
            raise ValueError(f"{where}: missing key {key!r}")
        _check_value(f"{where}[{key!r}]", obj[key], types)


def _check_list(where: str, items: Any, item_type: tuple[type, ...]) -> None:
    for i, item in enumerate(items):
        _check_value(f"{where}[{i}]", item, item_type)


def _check_inside(where: str, head: dict[str, Any], model: dict[str, Any]) -> None:
    for key, size in (("layer", model["layers"]), ("head", model["heads"])):
        if not 0 <= head[key] < size:
            raise ValueError(f"{where}[{key!r}]: outside the model's {size} {key}s, got {head[key]}")


def check_data(data: Any) -> None:
    """Raise ``ValueError`` naming the first key or value that does not fit the report schema."""
    _check_fields("data", data, _TOP)
    if data["schema"] != SCHEMA:
        raise ValueError(f"data['schema']: expected {SCHEMA!r}, got {data['schema']!r}")

    model = data["model"]
    _check_fields("data['model']", model, _MODEL)
    _check_list("data['model']['local_layers']", model["local_layers"], (int,))
    _check_list("data['model']['global_layers']", model["global_layers"], (int,))
    for key in ("layers", "heads"):
        if model[key] < 0:
            raise ValueError(f"data['model'][{key!r}]: must be >= 0, got {model[key]}")

    for i, ds in enumerate(data["datasets"]):
        _check_fields(f"data['datasets'][{i}]", ds, _DATASET)

    for i, role in enumerate(data["roles"]):
        where = f"data['roles'][{i}]"
        _check_fields(where, role, _ROLE)
        if not _COLOR.match(role["color"]):
            raise ValueError(f"{where}['color']: expected '#rrggbb', got {role['color']!r}")

    for i, head in enumerate(data["heads"]):
        where = f"data['heads'][{i}]"
        _check_fields(where, head, _HEAD)
        _check_list(f"{where}['secondary']", head["secondary"], (str,))
        _check_inside(where, head, model)
    # The role map is the model's grid: one cell per head of the layout (or none at all), never more.
    if data["heads"] and len(data["heads"]) != model["layers"] * model["heads"]:
        raise ValueError(
            f"data['heads']: expected {model['layers']} x {model['heads']} heads (the model's layout), "
            f"got {len(data['heads'])}"
        )

    for i, table in enumerate(data["tables"]):
        where = f"data['tables'][{i}]"
        _check_fields(where, table, _TABLE)
        for j, row in enumerate(table["rows"]):
            _check_fields(f"{where}['rows'][{j}]", row, _ROW)
            _check_inside(f"{where}['rows'][{j}]", row, model)

    for i, summary in enumerate(data["summaries"]):
        where = f"data['summaries'][{i}]"
        _check_fields(where, summary, _SUMMARY)
        _check_list(f"{where}['columns']", summary["columns"], (str,))
        for j, row in enumerate(summary["rows"]):
            _check_value(f"{where}['rows'][{j}]", row, (list,))
            _check_list(f"{where}['rows'][{j}]", row, (str, int, float, bool, type(None)))

    _check_list("data['notes']", data["notes"], (str,))

    for i, example in enumerate(data["examples"]):
        where = f"data['examples'][{i}]"
        _check_fields(where, example, _EXAMPLE)
        tokens = example["tokens"]
        _check_list(f"{where}['tokens']", tokens, (str,))
        if len(tokens) > _MAX_TOKENS:
            raise ValueError(f"{where}['tokens']: at most {_MAX_TOKENS} tokens, got {len(tokens)}")
        for key, value in example["maps"].items():
            if not _MAP_KEY.match(key):
                raise ValueError(f"{where}['maps']: key {key!r} is not 'layer,head'")
            _check_value(f"{where}['maps'][{key!r}]", value, (str,))

    if "kv_plan" in data:
        _check_kv_plan(data["kv_plan"])


def _check_kv_plan(plan: Any) -> None:
    _check_fields("data['kv_plan']", plan, _KV_PLAN)
    _check_list("data['kv_plan']['contexts']", plan["contexts"], (int,))
    _check_list("data['kv_plan']['notes']", plan["notes"], (str,))
    for i, head in enumerate(plan["heads"]):
        where = f"data['kv_plan']['heads'][{i}]"
        _check_fields(where, head, _KV_HEAD)
        for key, size in (("layer", plan["layers"]), ("kv_head", plan["kv_heads"])):
            if not 0 <= head[key] < size:
                raise ValueError(f"{where}[{key!r}]: outside the plan's {size} {key}s, got {head[key]}")
    for i, sparsity in enumerate(plan["sparsities"]):
        where = f"data['kv_plan']['sparsities'][{i}]"
        _check_fields(where, sparsity, _KV_SPARSITY)
        for j, kv in enumerate(sparsity["streaming"]):
            _check_value(f"{where}['streaming'][{j}]", kv, (list,))
            if len(kv) != 2:
                raise ValueError(f"{where}['streaming'][{j}]: expected [layer, kv_head], got {kv!r:.60}")
            _check_list(f"{where}['streaming'][{j}]", kv, (int,))
        for j, memory in enumerate(sparsity["memory"]):
            _check_fields(f"{where}['memory'][{j}]", memory, _KV_MEMORY)


def _finite(value: Any) -> Any:
    """A copy of ``value`` with every NaN or infinity replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def data_json(data: dict) -> str:
    """The report data as JSON that is safe inside a ``<script>`` element.

    ``<`` (and ``>``, ``&``) become ``\\u003c`` etc., so no string can close the element, and the
    ``:`` of a URL scheme is escaped so the page holds no network reference even as text;
    ``JSON.parse`` and ``json.loads`` give the original strings back.
    """
    text = json.dumps(_finite(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    # U+2028/2029 are valid in JSON but some tools treat them as line ends.
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return re.sub(r"(?i)(https?):", r"\1\\u003a", text)


def _asset(name: str) -> str:
    text = (resources.files("headscope.outputs") / "assets" / name).read_text(encoding="utf-8")
    closing = "</style" if name.endswith(".css") else "</script"
    if closing in text.lower():
        raise ValueError(f"asset {name} contains {closing!r}")
    return text


def _text(value: Any) -> str:
    """``value`` as HTML text (or an attribute value): escaped, with no URL scheme left to follow."""
    return re.sub(r"(?i)(https?):", r"\1&#58;", _html.escape(str(value), quote=True))


def _fmt(value: float | None, digits: int = 3, sign: str = "") -> str:
    return "\u2014" if value is None else f"{value:{sign}.{digits}f}"


def _size(value: float | None) -> str:
    from headscope.outputs.kvplan import human_bytes

    return "\u2014" if value is None else human_bytes(value)


_KV_CSS = """/* KV-cache plan (kv-plan reports only) */
.kv-plan .kv-facts { margin: 0.3rem 0; font-size: 0.92rem; }
.kv-plans { display: flex; flex-wrap: wrap; gap: 1rem 1.75rem; align-items: flex-start; }
.kv-sparsity { margin: 0; }
.kv-sparsity figcaption { font-weight: 600; font-size: 0.92rem; margin-bottom: 0.25rem; }
.kv-grid { display: grid; gap: 2px; width: max-content; font-size: 0.72rem; margin-bottom: 0.45rem; }
.kv-grid .kv-colhead, .kv-grid .kv-rowhead { color: var(--muted); text-align: center; line-height: 1.1rem; font-variant-numeric: tabular-nums; }
.kv-grid .kv-rowhead { text-align: right; padding-right: 0.3rem; }
.kv-cell { width: 1.5rem; height: 1.1rem; border-radius: 2px; border: 1px solid rgba(0, 0, 0, 0.15); }
.kv-full { background: #2e9d57; }
.kv-streaming { background: #9aa0a6; }
.kv-window { background: #eef2ee; border-style: dashed; }
.kv-none { background: repeating-linear-gradient(45deg, #fff, #fff 3px, #f1f1f1 3px, #f1f1f1 6px); }
.kv-legend .kv-key { display: inline-flex; align-items: center; gap: 0.35rem; font-size: 0.9rem; }
table.kv-table { margin: 0; }
"""

_KV_LEGEND = (
    ("full", "full: keeps the whole context"),
    ("streaming", "streaming: attention sink + recent window only"),
    ("window", "window: not a candidate (a sliding-window layer)"),
    ("none", "no attention in this layer"),
)


def _kv_decisions(plan: dict[str, Any], sparsity: dict[str, Any]) -> dict[tuple[int, int], str]:
    streaming = {(int(layer), int(kv)) for layer, kv in sparsity["streaming"]}
    out = {}
    for head in plan["heads"]:
        kv = (head["layer"], head["kv_head"])
        out[kv] = "window" if not head["candidate"] else "streaming" if kv in streaming else "full"
    return out


def _kv_grid(plan: dict[str, Any], sparsity: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """One sparsity's KV heads as the role map lays heads out: a row per layer, a column per KV head."""
    decisions = _kv_decisions(plan, sparsity)
    heads = {(h["layer"], h["kv_head"]): h for h in plan["heads"]}
    counts = {"full": 0, "streaming": 0, "window": 0, "none": 0}
    parts = ['<span class="kv-corner"></span>']
    parts += [f'<span class="kv-colhead">{kv}</span>' for kv in range(plan["kv_heads"])]
    for layer in range(plan["layers"]):
        parts.append(f'<span class="kv-rowhead">L{layer}</span>')
        for kv in range(plan["kv_heads"]):
            decision = decisions.get((layer, kv), "none")
            counts[decision] += 1
            head = heads.get((layer, kv))
            title = f"layer {layer} \u00b7 KV head {kv} \u00b7 {decision}"
            if head is not None:
                queries = ",".join(str(q) for q in head.get("query_heads") or [])
                if queries:
                    title += f" (query heads {queries})"
                title += (
                    f" \u00b7 long-range mass {_fmt(head['mass'])} \u00b7 retrieval {_fmt(head['retrieval'])}"
                )
                if head.get("ablation") is not None:
                    title += f" \u00b7 ablation \u0394loss {_fmt(head['ablation'])}"
            parts.append(
                f'<span class="kv-cell kv-{decision}" data-decision="{decision}" data-layer="{layer}" '
                f'data-kv-head="{kv}" title="{_text(title)}"></span>'
            )
    label = "KV heads by layer (rows) and KV head (columns): " + ", ".join(
        f"{n} {name}" for name, n in counts.items() if n
    )
    grid = (
        f'<div class="kv-grid" role="img" data-testid="kv-grid" aria-label="{_text(label)}" '
        f'style="grid-template-columns:auto repeat({max(plan["kv_heads"], 1)}, 1.5rem)">'
        + "".join(parts)
        + "</div>"
    )
    return grid, counts


def _kv_table(plan: dict[str, Any], sparsity: dict[str, Any]) -> str:
    ours = sparsity["plan"] or {}
    mean = sparsity["random_mean"] or {}
    base = (plan.get("full") or {}).get("text_loss")
    n_random = int(sparsity.get("random_plans") or 0)
    if not n_random:
        random_head = "random mean"
    elif sparsity.get("random_exhaustive"):
        random_head = f"all {n_random} plans (mean)"
    else:
        random_head = f"{n_random} random plans (mean)"

    def delta(value: float | None) -> str:
        return _fmt(None if value is None or base is None else value - base, sign="+")

    rows = [
        ("streaming", "streaming KV heads", f"{sparsity['n_streaming']} of {plan['candidates']}", None),
        ("accuracy", "needle accuracy", _fmt(ours.get("accuracy")), _fmt(mean.get("accuracy"))),
        ("answer_loss", "answer loss (nats)", _fmt(ours.get("answer_loss")), _fmt(mean.get("answer_loss"))),
        ("text_loss", "text loss vs full (nats)", delta(ours.get("text_loss")), delta(mean.get("text_loss"))),
    ]
    body = []
    for metric, label, plan_cell, random_cell in rows:
        cells = (
            f'<td class="num" colspan="2">{_text(plan_cell)}</td>'
            if random_cell is None
            else f'<td class="num">{_text(plan_cell)}</td><td class="num">{_text(random_cell)}</td>'
        )
        body.append(f'<tr data-metric="{metric}"><td>{_text(label)}</td>{cells}</tr>')
    for memory in sparsity["memory"]:
        share, reduction = memory["saved_share"], memory["reduction"]
        saved = "\u2014" if share is None else f"{share:.0%}"
        if reduction is not None:
            saved += f" ({reduction:.2f}\u00d7)"
        title = f"{_size(memory.get('full_bytes'))} \u2192 {_size(memory.get('plan_bytes'))} per sequence"
        body.append(
            f'<tr data-metric="memory" data-context="{memory["context"]}">'
            f"<td>KV cache saved at {memory['context']} tokens</td>"
            f'<td class="num" colspan="2" title="{_text(title)}">{_text(saved)}</td></tr>'
        )
    return (
        '<table class="plain kv-table" data-testid="kv-table"><thead><tr><th></th><th>plan</th>'
        f"<th>{_text(random_head)}</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    )


def _kv_section(plan: dict[str, Any]) -> str:
    """The ``kv-plan`` section: settings, a legend, and per sparsity a KV-head grid and a table."""
    total = len(plan["heads"])
    contexts = ", ".join(str(c) for c in plan["contexts"]) or "\u2014"
    facts = [
        f"model <b>{_text(plan['model'])}</b>",
        f"ranked by <b>{_text(plan['method'])}</b>",
        f"streaming heads keep sink {plan['sink']} + recent {plan['recent']} tokens",
        f"context{'s' if len(plan['contexts']) != 1 else ''} {_text(contexts)} tokens",
        f"{plan['candidates']} of {total} KV heads are candidates",
    ]
    if plan.get("prompts") or plan.get("text_chunks"):
        facts.append(
            f"{plan.get('prompts', 0)} needle prompts, {plan.get('text_chunks', 0)} stretches of text"
        )
    full = plan.get("full") or {}
    if full:
        facts.append(
            f"full attention: needle accuracy {_fmt(full.get('accuracy'))}, "
            f"answer loss {_fmt(full.get('answer_loss'))}, text loss {_fmt(full.get('text_loss'))} nats"
        )
    parts = [
        '<section id="kv-plan" class="kv-plan" data-testid="kv-plan" aria-labelledby="kv-plan-title">',
        '<h2 id="kv-plan-title">KV-cache plan</h2>',
        '<p class="kv-facts" data-testid="kv-facts">' + " \u00b7 ".join(facts) + "</p>",
    ]
    agreement = {k: v for k, v in (plan.get("agreement") or {}).items() if v is not None}
    if agreement:
        parts.append(
            '<p class="kv-facts">rank agreement with leave-one-out ablation (Spearman): '
            + _text(", ".join(f"{name} {value:+.2f}" for name, value in agreement.items()))
            + "</p>"
        )
    if plan["notes"]:
        parts.append(
            '<ul class="notes" data-testid="kv-notes">'
            + "".join(f"<li>{_text(note)}</li>" for note in plan["notes"])
            + "</ul>"
        )
    figures = []
    shown: set[str] = set()
    for sparsity in plan["sparsities"]:
        grid, counts = _kv_grid(plan, sparsity)
        shown |= {name for name, n in counts.items() if n}
        level = "?" if sparsity["sparsity"] is None else f"{sparsity['sparsity']:g}"
        figures.append(
            f'<figure class="kv-sparsity" data-testid="kv-sparsity" data-sparsity="{level}">'
            f"<figcaption>sparsity {level} \u00b7 {counts['full']} full, {counts['streaming']} streaming</figcaption>"
            + grid
            + _kv_table(plan, sparsity)
            + "</figure>"
        )
    legend = [
        f'<span class="kv-key"><span class="swatch kv-{name}" aria-hidden="true"></span>{_text(text)}</span>'
        for name, text in _KV_LEGEND
        if name != "none" or name in shown
    ]
    parts.append('<div class="legend kv-legend" data-testid="kv-legend">' + "".join(legend) + "</div>")
    if figures:
        parts.append('<div class="kv-plans">' + "".join(figures) + "</div>")
    else:
        parts.append('<p class="empty">No sparsity was planned.</p>')
    parts.append("</section>\n")
    return "".join(parts)


def render(data: dict) -> str:
    """The whole report as one HTML document (a string)."""
    check_data(data)
    title = _text(data["title"])
    css = _asset("report.css")
    js = _asset("report.js")
    kv_plan = data.get("kv_plan")
    if kv_plan is not None:  # drawn here, before the role map; a report without it is unchanged
        css += _KV_CSS
    kv_section = "" if kv_plan is None else _kv_section(kv_plan)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="headscope">\n'
        f"<title>{title}</title>\n"
        f"<style>\n{css}</style>\n"
        "</head>\n<body>\n"
        '<header id="header"><h1 id="title">'
        f"{title}</h1></header>\n"
        '<noscript><p class="noscript">This report is drawn by JavaScript; '
        "enable it to see the tables. The data is in the page source.</p></noscript>\n"
        f"{kv_section}"
        '<main id="main"></main>\n'
        '<div id="tooltip" data-testid="tooltip" role="tooltip" hidden></div>\n'
        f'<script id="headscope-data" type="application/json">{data_json(data)}</script>\n'
        f"<script>\n{js}</script>\n"
        "</body>\n</html>\n"
    )
