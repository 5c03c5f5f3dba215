"""``graph --html``: the head graph as a page of the HTML report (its shell, stylesheet and header),
drawn offline by an inline script (:file:`graph_page.js`, beside this module) from the graph's JSON.

Layers are rows (the embedding at the bottom, the last layer on top), each head a node coloured by
its role, each layer's MLP a square at the row's end; an edge runs from a source up to the head it
feeds, coloured by side (query, key, value) and as wide as its share. Hovering or clicking a head
shows its card (role, margin, its top sources per side with their intervals) and lights up its
sources to the depth chosen; filters keep some sides, the heads of one role, the edges above a
share. ``page.html#L23H0`` opens that head.

The page embeds what a person looks at, not the whole result: every edge, and per head and side
the sources that are edges plus the strongest few (:data:`SHOWN`). 30 layers x 9 heads with 2,000
edges: the graph's section is about 0.3 MB, the whole page (with the report's tables of the edges)
about 0.8 MB (``tests/unit/test_graph_page.py``).

The page is the report's (``Result.html``): ``Graph.html_section`` returns :func:`html_section`,
so ``headscope report`` on a saved graph result draws the graph too.
"""

from __future__ import annotations

import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

SIDES = ("query", "key", "value")
SHOWN = 8  # sources per side on a head's card, besides its edges
# The side colours (Okabe-Ito: told apart by most colour-blind readers too).
SIDE_COLORS = {"query": "#0072b2", "key": "#e69f00", "value": "#009e73"}
NO_ROLE_COLOR = "#ffffff"

SECTION_CSS = """/* headscope graph: the head graph */
.graph-section .filters { position: static; }
.graph-section .filters input[type=range] { width: 12rem; vertical-align: middle; }
.graph-section .filters input[type=number] { width: 3.5rem; }
.graph-count { font-variant-numeric: tabular-nums; }
.graph-body { display: flex; flex-wrap: wrap; gap: 1rem; align-items: flex-start; }
.graph-scroll { flex: 0 1 auto; max-width: 100%; max-height: 85vh; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
.graph-scroll svg { display: block; }
.graph-card { flex: 1 1 26rem; min-width: min(26rem, 100%); position: sticky; top: 0.5rem;
  max-height: calc(100vh - 1rem); overflow: auto; background: var(--panel-bg); border: 1px solid var(--line);
  border-radius: 6px; padding: 0.6rem 0.9rem 0.9rem; }
.graph-card h3 { margin: 0.2rem 0 0.3rem; }
.graph-card h4 { margin: 0.7rem 0 0.2rem; font-size: 0.92rem; }
.graph-card .edge-mark { font-weight: 700; }
.graph-section .side-swatch { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 2px; margin-right: 0.3em; vertical-align: -0.05em; }
.graph-legend { display: flex; flex-wrap: wrap; gap: 0.2rem 1rem; margin: 0.4rem 0; font-size: 0.88rem; }
.graph-node { cursor: pointer; }
.graph-node:focus { outline: none; }
.graph-node:focus .shape, .graph-node.selected .shape { stroke: var(--focus); stroke-width: 3; }
.graph-node text { pointer-events: none; font-size: 10px; }
.graph-svg.lit .graph-edge:not(.lit) { opacity: 0.07; }
.graph-svg.lit .graph-node:not(.lit) { opacity: 0.25; }
.graph-node.off { opacity: 0.3; }
"""


def _number(value: Any, digits: int = 4) -> float | None:
    """A finite float, rounded (the page shows three decimals), else None."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return round(number, digits) if math.isfinite(number) else None


def _shape(found: Any) -> tuple[int, int]:
    """(layers, heads per layer): the largest layer and head any head or source names, plus one."""
    layers, heads = 0, 0
    names = [item["source"] for entry in found.heads for side in SIDES for item in entry.get(side, [])]
    names += [edge["source"] for edge in found.edges]
    for entry in [*found.heads, *found.edges]:
        layers, heads = max(layers, entry["layer"] + 1), max(heads, entry["head"] + 1)
    for name in names:
        head = re.fullmatch(r"L(\d+)H(\d+)", name)
        mlp = re.fullmatch(r"mlp(\d+)", name)
        if head:
            layers, heads = max(layers, int(head[1]) + 1), max(heads, int(head[2]) + 1)
        elif mlp:
            layers = max(layers, int(mlp[1]) + 1)
    return layers, heads


def _role_look(label: str) -> dict[str, str]:
    """A role's colour and meaning as the report draws them: graph's roles are detector names
    (induction, previous-token), the report's role labels (ind, prev) are found too."""
    from headscope.verdicts.roles import role_spec, spec_for_label

    spec = role_spec(label, "") or spec_for_label(label)
    return {"color": spec.color, "meaning": spec.meaning}


def page_data(found: Any, model: str) -> dict[str, Any]:
    """What the page's script draws from: every head with its card's sources, every edge (compact
    rows ``[head index, side index, source index, share, ci_low, ci_high, verified_ratio]``)."""
    names: dict[str, int] = {}
    source_roles: dict[str, str] = {}

    def named(item: dict[str, Any]) -> int:
        name = str(item["source"])
        if item.get("role"):
            source_roles[name] = str(item["role"])
        return names.setdefault(name, len(names))

    index = {(entry["layer"], entry["head"]): i for i, entry in enumerate(found.heads)}
    edges = []
    edged: set[tuple[int, str, str]] = set()
    for edge in found.edges:
        key = (edge["layer"], edge["head"])
        if key not in index or edge["side"] not in SIDES:
            continue
        edged.add((index[key], edge["side"], edge["source"]))
        edges.append(
            [
                index[key],
                SIDES.index(edge["side"]),
                named(edge),
                _number(edge.get("share")),
                _number(edge.get("ci_low")),
                _number(edge.get("ci_high")),
                _number(edge.get("verified_ratio")),
            ]
        )
    heads = []
    for i, entry in enumerate(found.heads):
        listed: dict[str, list[list[Any]]] = {}
        for side in SIDES:
            items = [it for it in entry.get(side, []) if _number(it.get("share")) is not None]
            items.sort(key=lambda it: -float(it["share"]))
            kept = [it for n, it in enumerate(items) if n < SHOWN or (i, side, it["source"]) in edged]
            listed[side] = [
                [named(it), _number(it["share"]), _number(it.get("ci_low")), _number(it.get("ci_high"))]
                for it in kept
            ]
        heads.append(
            {
                "layer": entry["layer"],
                "head": entry["head"],
                "kv_group": entry.get("kv_group"),
                "role": entry.get("role") or "",
                "margin": _number(entry.get("margin")),
                "output": _number(entry.get("output")),
                "unresolved": entry.get("unresolved") or "",
                "value_unresolved": entry.get("value_unresolved") or "",
                "windows": entry.get("windows"),
                "sources": listed,
            }
        )
    layers, per_layer = _shape(found)
    labels = sorted({h["role"] for h in heads if h["role"]} | set(source_roles.values()))
    return {
        "model": model,
        "data": found.data,
        "measure": found.measure,
        "threshold": _number(found.threshold),
        "layers": layers,
        "heads_per_layer": per_layer,
        "sides": list(SIDES),
        "side_colors": SIDE_COLORS,
        "roles": [{"label": label, **_role_look(label)} for label in labels],
        "no_role_color": NO_ROLE_COLOR,
        "names": list(names),
        "source_roles": source_roles,
        "heads": heads,
        "edges": edges,
    }


def script_json(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (as the report's data): no ``<``, ``>`` or
    ``&`` (so no string closes the element), no line separators, and the ``:`` of a URL scheme
    escaped so the page holds no network reference even as text. ``JSON.parse`` reads it back."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return re.sub(r"(?i)(https?):", r"\1\\u003a", text)


def _text(value: Any) -> str:
    """Text for the page's HTML, escaped, with the ``:`` of a URL scheme as an entity (the page
    holds no network reference, even as text)."""
    return re.sub(r"(?i)(https?):", r"\1&#58;", html.escape(str(value)))


def _script() -> str:
    text = (resources.files(__package__) / "graph_page.js").read_text(encoding="utf-8")
    if "</script" in text.lower():
        raise ValueError("graph_page.js contains '</script'")
    return text


def section(found: Any, model: str) -> str:
    """The graph's section of the report: its style, the controls, the data and the script."""
    data = page_data(found, model)
    measure = (
        "contrast (answer against distractor at the final token)" if found.measure == "contrast" else "margin"
    )
    legend = "".join(
        f'<span><span class="side-swatch" style="background:{color}"></span>{side}</span>'
        for side, color in SIDE_COLORS.items()
    )
    return (
        f"<style>{SECTION_CSS}</style>"
        '<section id="graph" class="graph-section" data-testid="graph" aria-labelledby="graph-title">'
        '<h2 id="graph-title">How heads compose</h2>'
        f"<p>{_text(found.data)}: {len(data['edges'])} edges, each a source with a share of at least "
        f"{found.threshold:g} of one side of a head, its 95% interval above 0: queries and keys of the "
        f"head's {_text(measure)}, values of its output. Layers are rows, the embedding at the "
        "bottom; an edge rises from a source to the head it feeds, as wide as its share. Hover or click a "
        "head to see its card and its sources; the URL's #L3H1 opens a head.</p>"
        f'<p class="graph-legend" aria-label="sides">edges: {legend}</p>'
        '<div id="graph-roles" class="graph-legend" aria-label="roles"></div>'
        '<div id="graph-controls" class="filters" role="search" aria-label="filter the graph"></div>'
        '<div class="graph-body"><div class="graph-scroll" id="graph-scroll"></div>'
        '<aside id="graph-card" class="graph-card" data-testid="graph-card" aria-live="polite">'
        "<p class=muted>Hover or click a head.</p></aside></div>"
        f'<script id="graph-data" type="application/json">{script_json(data)}</script>'
        f"<script>\n{_script()}</script>"
        "</section>"
    )


def html_section(result: Any) -> str | None:
    """``Graph.html_section``: the section for a live or saved graph result (None without a graph)."""
    found = result.graph
    return None if found is None else section(found, str(result.model))


def write_graph_html(result: Any, path: Path, force: bool) -> str:
    """``--html``: the report's page with the head graph on top (no attention heatmaps), atomic."""
    from headscope.errors import InputError
    from headscope.extend.writers import html_file

    if result.graph is None:
        raise InputError(f"--html {path}: the result has no graph", hint="run headscope graph")
    return html_file(path, result.html(examples=False), force)
