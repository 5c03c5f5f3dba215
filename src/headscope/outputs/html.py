"""The HTML report: one self-contained, offline page.

``render(data)`` returns a single HTML document: the stylesheet in a ``<style>``, the report data as
JSON in ``<script id="headscope-data" type="application/json">`` and the script that draws the page
from it. Nothing is loaded from the network (no fonts, no CDNs), so the file works from ``file://``
and can be mailed around. ``check_data(data)`` validates the shape the page relies on.
"""

from __future__ import annotations

import json
import math
import re
from contextvars import ContextVar
from importlib import resources
from typing import Any

from headscope.extend.render import check_fields as _check_fields
from headscope.extend.render import check_list as _check_list
from headscope.extend.render import check_value as _check_value
from headscope.extend.render import html_text as _text

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


_STYLE = re.compile(r"^\s*<style>\n?(.*?)</style>\n?", re.S)


def render(data: dict, sections: list[str] | tuple[str, ...] = ()) -> str:
    """The whole report as one HTML document (a string). ``sections``: the analyses' own sections
    (:meth:`headscope.extend.protocol.Analysis.html_section`), drawn in order above the role map;
    a ``<style>`` a section opens with joins the page's stylesheet."""
    check_data(data)
    title = _text(data["title"])
    css = _asset("report.css")
    js = _asset("report.js")
    body = []
    for fragment in sections:
        style = _STYLE.match(fragment)
        if style is not None:
            if "</style" in style.group(1).lower() or "<script" in style.group(1).lower():
                raise ValueError("an analysis' section style must be plain CSS")
            css += style.group(1)
            fragment = fragment[style.end() :]
        body.append(fragment)
    section_html = "".join(body)
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
        f"{section_html}"
        '<main id="main"></main>\n'
        '<div id="tooltip" data-testid="tooltip" role="tooltip" hidden></div>\n'
        f'<script id="headscope-data" type="application/json">{data_json(data)}</script>\n'
        f"<script>\n{js}</script>\n"
        "</body>\n</html>\n"
    )
