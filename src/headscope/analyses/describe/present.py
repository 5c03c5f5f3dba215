"""How ``describe`` shows itself: the terminal tables and the HTML page of cards."""

from __future__ import annotations

import base64
import html
import struct
import zlib
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from .atlas import KINDS, Atlas, describe_components, excerpt_maps, grid_label, nearest_heads
from .card import matters_line, writes_line


def _ci(entry: dict[str, Any]) -> str:
    if entry.get("value") is None:
        return "none"
    if entry.get("ci_low") is None:
        return f"{entry['value']:.3f}"
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def summary_line(atlas: Atlas) -> str:
    ev, fit = atlas.evaluation, atlas.fit
    off = atlas.explained_off_first
    # Atlases written before the pooling was stated took the mean over heads.
    pooled = (
        "pooled over heads, each weighing by its attention there" if off.get("pooling") else "mean over heads"
    )
    if off.get("heads_without"):
        count = off["heads_without"]
        pooled += f"; {count} head{' has' if count == 1 else 's have'} no attention off the first token"
    return (
        f"explained share {_ci(atlas.explained)} (mean over {len(atlas.heads)} heads), off the first token "
        f"{_ci(off)} ({pooled}; evaluation: {ev['from']}, {ev['windows']} windows, "
        f"{ev['queries']} {'sampled ' if ev.get('rows_per_window') else ''}queries; fitted on {fit['windows']} other windows; {ev['interval']}). "
        f"Without query classes: {atlas.explained_unconditioned['value']:.3f}."
    )


def print_atlas(atlas: Atlas, console: Console, top: int = 10) -> None:
    """The summary, the division of labour by layer, the least explained heads, then every head."""
    console.print(f"{atlas.model}: every head described by templates", soft_wrap=True)
    console.print(summary_line(atlas), soft_wrap=True, highlight=False)
    by_layer = atlas.by_layer()
    shown = [
        k for k in KINDS if any(row.get(k, 0) for row in by_layer.values())
    ]  # kinds no head has: left out
    kinds = Table(title="dominant kind of template per layer (heads)", title_justify="left")
    kinds.add_column("layer", justify="right")
    for kind in shown:
        kinds.add_column(kind, justify="right", no_wrap=True)
    for layer, row in by_layer.items():
        kinds.add_row(layer, *(str(row.get(kind, 0) or "") for kind in shown))
    console.print(kinds)
    worst = sorted(atlas.heads, key=lambda h: h["explained"]["value"])[: max(0, top)]
    if worst:
        console.print(
            "least explained: "
            + ", ".join(f"L{h['layer']}H{h['head']} leaves {h['left']:.2f}" for h in worst),
            soft_wrap=True,
            highlight=False,
        )
    for line in card_notes(atlas):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    console.print(
        "each head: explained share [95% CI] on evaluation text, its share off the first token ("
        "— where it has no attention there), its attention on the first token, then its description (weights sum to 1) and roles"
        + ("; below it, what it writes" if _writes_read(atlas) else "")
        + ("; and what ablating it costs" if atlas.ablation else ""),
        soft_wrap=True,
    )
    for head in atlas.heads:
        roles = f"  roles: {','.join(head['roles'])}" if head["roles"] else ""
        console.print(
            f"L{head['layer']}H{head['head']:<3} {head['dominant']:<22} {_ci(head['explained'])}  "
            f"off {_short(head['explained_off_first'])}  first {head['first_token']:.2f}  "
            f"{describe_components(head['components'], fit_counts=atlas.fit.get('query_classes'))}{roles}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        extra = [writes_line(head) if _writes_read(atlas) else None, matters_line(head), why_line(head)]
        for line in filter(None, extra):
            console.print(f"       {line}", soft_wrap=True, highlight=False, markup=False)


def why_line(head: dict[str, Any]) -> str | None:
    """ "why: keys from L16H0 (previous-token) 0.35 [0.33, 0.37], mlp11 0.25; queries from mlp0 0.21;
    the description explains 0.41, its top 3 key and query sources rebuild 0.49" (describe --why)."""
    why = head.get("why")
    if not why:
        return None
    from headscope.analyses.qk_present import source_text

    if why.get("unresolved"):
        return f"why: no shares ({why['unresolved']})"
    keys = ", ".join(source_text(item) for item in why["key"][:2])
    queries = ", ".join(source_text(item) for item in why["query"][:2])
    text = f"why: keys from {keys}; queries from {queries}"
    rebuilt = next((r for r in why.get("reconstructed", []) if r["k"] == 3), None)
    if rebuilt is not None:
        text += (
            f"; the description explains {head['explained']['value']:.2f}, its top 3 key and query "
            f"sources rebuild {rebuilt['explained']:.2f}"
        )
    return text


def _short(entry: dict[str, Any]) -> str:
    """A share in a head's row: two digits, or '—' where it has none (no attention off the first token)."""
    return "  — " if entry.get("value") is None else f"{entry['value']:.2f}"


def _writes_read(atlas: Atlas) -> bool:
    return bool(atlas.writes) and not atlas.writes.get("reason")


def card_notes(atlas: Atlas) -> list[str]:
    """How the writes and the ablation were measured, once for every card (or why the writes were not read)."""
    out = []
    writes = atlas.writes
    if writes and writes.get("reason"):
        out.append(f"what each head writes: not read: {writes['reason']}")
    elif writes:
        out.append(
            f"what each head writes: its OV circuit from the weights alone, as headscope weights reads it "
            f"({writes['tokens']} sampled tokens, seed {writes['seed']}, {writes['embedding']} embedding): the "
            f"tokens its mean write promotes and suppresses, and how often a token's own logit is in its "
            f"top {writes['k']} (copies) or bottom {writes['k']}"
        )
    ablation = atlas.ablation
    if ablation:
        out.append(
            f"whether it matters: {ablation['heads']} heads ({ablation['chosen']}) mean-ablated one at a time "
            f"on the {ablation['windows']} evaluation windows ({ablation['tokens']} tokens; clean loss "
            f"{ablation['clean_loss']:.4f} nats/token), against {ablation['controls']}; "
            f"{ablation['interval']}"
        )
    return out


# One colour per dominant kind (the grid's hue; its lightness is the explained share).
KIND_COLORS = {
    "sink": "#868e96",
    "offset": "#1c7ed6",
    "diffuse": "#f59f00",
    "token": "#e03131",
    "structure": "#2f9e44",
    "syntax": "#9c36b5",
    "key-class": "#0c8599",
    "other": "#495057",
}
CELL = 8  # pixels per heatmap cell


def ink(values: np.ndarray) -> np.ndarray:
    """The grey level a heatmap draws for each value in [0, 1] (on the uint8 grid): white for 0,
    black for 1, on a square-root scale so that weak attention still shows. The page tints it
    (``mix-blend-mode: screen`` over dark blue), the same for every map, so two maps compare cell
    by cell."""
    index = np.rint(np.clip(values, 0, 1) * 255)
    return np.rint(255 * (1 - np.sqrt(index / 255))).astype(np.uint8)


def _png(values: np.ndarray) -> str:
    """A data URI of ``values`` (``[rows, cols]`` in [0, 1]) as a greyscale PNG of :func:`ink`, one
    pixel per cell (no palette: the smallest file for a few thousand cells)."""
    rows, cols = values.shape
    grey = ink(values)
    raw = b"".join(b"\x00" + grey[r].tobytes() for r in range(rows))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", cols, rows, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _token(piece: str) -> str:
    """A token as a heatmap label: specials named, whitespace made visible."""
    if piece == "":
        return "⟨special⟩"
    return piece.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·")


def axis_labels(tokens: list[str]) -> tuple[str, str]:
    """The heatmaps' key labels (the first token, then the excerpt) and query labels (the excerpt)."""
    esc = html.escape
    shown = [esc(_token(t)) for t in tokens]
    return "".join(f"<span>{t}</span>" for t in shown), "".join(f"<span>{t}</span>" for t in shown[1:])


def heatmaps_html(maps: dict[str, Any], shared: str | None = None) -> str:
    """The card's two heatmaps, side by side on one colour scale: the head's attention on the
    excerpt and the description's prediction, query tokens down (each query's explained share
    beside its row) and keys across (the first token, then the excerpt). ``shared``: the excerpt's
    name (its atlas' prefix and index) when the page holds its labels once for every card (:func:`card_templates`; the page's
    script fills them in), else the labels are written into the card."""
    esc = html.escape
    n = len(maps["tokens"]) - 1
    if shared is None:
        keys, queries = axis_labels(maps["tokens"])
        x_axis, y_axis = f"<div class=hm-x>{keys}</div>", f"<div class=hm-y>{queries}</div>"
    else:
        x_axis = f"<div class=hm-x data-labels='x{shared}'></div>"
        y_axis = f"<div class=hm-y data-labels='y{shared}'></div>"
    shares = "".join(f"<span>{v:.2f}</span>" for v in maps["explained"])
    size = f"width:{(n + 1) * CELL}px;height:{n * CELL}px"

    def figure(name: str, title: str, values: np.ndarray, extra: str = "") -> str:
        return (
            f"<figure class=hm-fig data-map='{name}' data-rows='{n}' data-cols='{n + 1}'>"
            f"<figcaption>{title}</figcaption><div class=hm-box style='--c:{CELL}px'>"
            f"<div class=hm-corner></div>{x_axis}{y_axis}"
            f"<span class=hm-tint><img class=hm-img data-testid=card-heatmap alt='{title}' "
            f"src='{_png(values)}' style='{size}'></span>{extra}</div></figure>"
        )

    return (
        f"<div class=hm-pair data-testid=card-heatmaps><p class=hm-note>{esc(maps['window'])}, tokens "
        f"{maps['start']}–{maps['start'] + n - 1}: the excerpt where its attention off the first token "
        f"is largest ({maps['off_first']:.2f} per query); column 0 is the first token; one √ scale, "
        "white 0 to dark blue 1</p>"
        + figure("actual", "attention", maps["actual"])
        + figure(
            "predicted",
            "the description's prediction",
            maps["predicted"],
            f"<div class=hm-share title='each query&#39;s explained share'>{shares}</div>",
        )
        + "</div>"
    )


def _bar(label: str, entry: dict[str, Any] | float | None, title: str = "") -> str:
    """One share as a bar (with its interval as a whisker), and its number."""
    if isinstance(entry, dict):
        value, low, high = entry.get("value"), entry.get("ci_low"), entry.get("ci_high")
    else:
        value, low, high = entry, None, None
    if value is None:
        return f"<div class=sb><span class=sb-l>{label}</span><span class=sb-t>— {title}</span></div>"
    whisker = (
        f"<i style='left:{100 * low:.1f}%;width:{100 * max(high - low, 0):.1f}%'></i>"
        if low is not None and high is not None
        else ""
    )
    text = f"{value:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else "")
    return (
        f"<div class=sb><span class=sb-l>{label}</span><span class=sb-b><b style='width:{100 * value:.1f}%'>"
        f"</b>{whisker}</span><span class=sb-t>{text}</span></div>"
    )


def _components_html(head: dict[str, Any], fit_counts: dict[str, int] | None) -> str:
    """The description, then its weights as bars: one group per distinct mixture, headed by the
    query classes that share it."""
    esc = html.escape
    groups: dict[tuple[tuple[str, float], ...], list[str]] = {}
    by_class: dict[str, list[tuple[str, float]]] = {}
    for c in head["components"]:
        by_class.setdefault(c["query_class"], []).append((c["name"], c["weight"]))
    for query_class, parts in by_class.items():
        groups.setdefault(tuple(parts), []).append(query_class)
    rows = []
    for parts, classes in groups.items():
        if classes != ["all"]:
            rows.append(f"<div class=sb-g>on {esc(', '.join(classes))}</div>")
        rows.extend(
            f"<div class=sb><span class=sb-l>{esc(name)}</span><span class=sb-b><b style='width:"
            f"{100 * weight:.1f}%'></b></span><span class=sb-t>{weight:.2f}</span></div>"
            for name, weight in parts
        )
    return (
        f"<p class=desc>{esc(describe_components(head['components'], fit_counts=fit_counts))}</p>"
        f"<div class=weights data-testid=card-weights>{''.join(rows)}</div>"
    )


def head_card(
    head: dict[str, Any],
    fit_counts: dict[str, int] | None = None,
    maps: dict[str, Any] | None = None,
    shared_labels: str | None = None,
) -> str:
    """One head's card: the description with its weights as bars, the shares with intervals, the two
    heatmaps (``maps``: :func:`~.atlas.excerpt_maps`), the top contexts, what it writes, whether it
    matters and why it attends there."""
    esc = html.escape
    rows = []
    for context in head["contexts"]:
        arrows = "".join(
            f"<li><span class=k>{esc(a['before'])}<b>{esc(a['key_token'])}</b></span> … "
            f"<span class=q>{esc(a['between'][-30:])}<b>{esc(a['query_token'])}</b></span> "
            f"<span class=w>{a['weight']:.2f}</span></li>"
            for a in context["arrows"]
        )
        rows.append(
            f"<div class=ctx><div class=win>{esc(context['window'])}: "
            f"{context['off_first']:.2f} off the first token</div><ol>{arrows}</ol></div>"
        )
    name = f"L{head['layer']}H{head['head']}"
    if not isinstance(head["explained"]["value"], float | int):  # a card needs its share
        raise TypeError(f"explained share {head['explained']['value']!r}")
    roles = "".join(f"<span class=role-badge>{esc(r)}</span>" for r in head["roles"]) or "none"
    return (
        f"<section class=card id='{name}' data-layer='{head['layer']}' data-head='{head['head']}' "
        f"data-testid=card>"
        f"<h3>{name} <small>KV group {head['kv_group']}</small> — {esc(head['dominant'])}"
        + (f" <small>({esc(head['dominant_kind'])})</small>" if head.get("dominant_kind") else "")
        + "</h3>"
        + _components_html(head, fit_counts)
        + "<div class=shares>"
        + _bar("explained", head["explained"])
        + _bar(
            "off first",
            head["explained_off_first"],
            "none to explain (all its attention is on the first token)",
        )
        + _bar("on first token", head["first_token"])
        + "</div>"
        + f"<p>leaves {head['left']:.2f} unexplained. Roles: {roles}.</p>"
        + (
            heatmaps_html(maps, f"{shared_labels}{head['excerpt']['index']}" if shared_labels else None)
            if maps is not None
            else ""
        )
        + "".join(f"<p class=card-{cls}>{esc(line)}</p>" for cls, line in _card_lines(head))
        + f"<details open><summary>top contexts (strongest key, off the first token, of its strongest "
        f"queries)</summary>{''.join(rows)}</details></section>"
    )


def _card_lines(head: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's lines on what the head writes (or why that was not read) and whether it matters."""
    lines = [("writes", writes_line(head)), ("matters", matters_line(head)), ("why", why_line(head))]
    return [(cls, line) for cls, line in lines if line]


# The card's look, in the report's head panel and in a notebook (Result.card).
CARD_CSS = """/* describe cards (the report's head panel; Result.card in a notebook) */
.head-card .card { border: 1px solid rgba(0, 0, 0, 0.15); border-radius: 6px; padding: 0.4rem 0.7rem; margin: 0.6rem 0; background: #fff; }
.head-card .card h3 { font-size: 0.95rem; margin: 0.2rem 0; }
.head-card .desc { font-family: monospace; font-size: 0.85rem; }
.head-card .k b { color: #c92a2a; } .head-card .q b { color: #1864ab; }
.head-card .win { color: var(--muted, #555); font-size: 90%; }
.head-card .sb { display: flex; align-items: center; gap: 0.5rem; font-size: 0.82rem; }
.head-card .sb-l { width: 9rem; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.head-card .sb-b { position: relative; width: 10rem; height: 0.6rem; background: #eceef0; flex: none; }
.head-card .sb-b b { position: absolute; left: 0; top: 0; bottom: 0; background: #4dabf7; }
.head-card .sb-b i { position: absolute; top: 45%; height: 2px; background: #1d2125; }
.head-card .sb-t { font-variant-numeric: tabular-nums; white-space: nowrap; }
.head-card .shares { margin: 0.4rem 0; }
.head-card .pair { display: flex; flex-wrap: wrap; gap: 0.8rem; } .head-card .pair > div { flex: 1 1 28rem; min-width: 0; }
.head-card .partner > p { margin: 0.6rem 0 0; font-size: 0.88rem; }
.head-card .sb-g { font-size: 0.8rem; color: var(--muted, #555); margin-top: 0.2rem; }
.head-card .role-badge { display: inline-block; padding: 0 0.3rem; border: 1px solid #1d2125; border-radius: 3px; margin-right: 0.2rem; font-weight: 600; }
.hm-pair { display: flex; flex-wrap: wrap; gap: 0.8rem; align-items: flex-start; margin: 0.5rem 0; }
.hm-note { flex-basis: 100%; margin: 0; font-size: 0.8rem; color: var(--muted, #555); }
.hm-fig { margin: 0; }
.hm-fig figcaption { font-weight: 600; font-size: 0.85rem; }
.hm-box { display: grid; grid-template-columns: auto auto auto; grid-template-rows: auto auto; font-size: calc(var(--c) - 1px); line-height: var(--c); }
.hm-corner { grid-column: 1; grid-row: 1; }
.hm-x { grid-column: 2; grid-row: 1; display: flex; align-items: flex-end; }
.hm-x span { writing-mode: vertical-rl; width: var(--c); max-height: 7em; overflow: hidden; white-space: pre; flex: none; }
.hm-y { grid-column: 1; grid-row: 2; display: flex; flex-direction: column; align-items: flex-end; }
.hm-y span, .hm-share span { height: var(--c); max-width: 8em; overflow: hidden; white-space: pre; padding: 0 0.2em; flex: none; }
.hm-tint { grid-column: 2; grid-row: 2; background: #08306b; isolation: isolate; display: block; line-height: 0; align-self: start; justify-self: start; }
.hm-img { image-rendering: pixelated; mix-blend-mode: screen; display: block; }
.hm-share { grid-column: 3; grid-row: 2; display: flex; flex-direction: column; color: #555; font-variant-numeric: tabular-nums; }
"""

# The atlas' own section above the grid: summary plots, legend, notes.
SECTION_CSS = """/* describe's summary plots */
.atlas-summary { display: flex; flex-wrap: wrap; gap: 1.5rem; align-items: flex-start; }
.atlas-summary figure { margin: 0; } .atlas-summary figcaption { font-weight: 600; font-size: 0.88rem; }
.atlas-summary svg text { font-size: 10px; fill: #555; }
.kind-legend { display: flex; flex-wrap: wrap; gap: 0.2rem 1rem; font-size: 0.88rem; margin: 0.4rem 0; }
.kind-legend span i { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 2px; margin-right: 0.3em; vertical-align: -0.1em; }
.cell.dimmed { opacity: 0.15; }
.cell.role-badge { box-shadow: inset 0 0 0 2px #1d2125; }
.map .grid-filters { width: 0; min-width: 100%; }
.grid-filters { display: flex; flex-wrap: wrap; gap: 0.4rem 0.9rem; margin: 0.3rem 0 0.5rem; font-size: 0.88rem; }
.grid-filters select, .grid-filters input { font: inherit; font-size: 0.86rem; }
.grid-filters input[type="number"] { width: 4.5rem; }
svg .beside-cell { cursor: pointer; } svg .beside-cell:focus { outline: none; }
svg .beside-cell.selected, svg .beside-cell:focus-visible { stroke: #1d2125; stroke-width: 1.5; }
"""


def cell_color(kind: str, share: float) -> str:
    """The grid's colour of a head: its dominant kind's hue, lighter the less it explains (white at 0)."""
    base = KIND_COLORS.get(kind, KIND_COLORS["other"])
    mix = 0.15 + 0.85 * min(max(share, 0.0), 1.0)
    rgb = [int(base[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 + (c - 255) * mix):02x}" for c in rgb)


def cell_attributes(head: dict[str, Any]) -> dict[str, str]:
    """What the report's grid draws for a described head (the card template's data attributes):
    its colour, label, tooltip line, and what the filters read."""
    share = head["explained"]["value"] or 0.0
    roles = [r for r in head["roles"] if r and r != "sink"]
    return {
        "color": cell_color(head["dominant_kind"], share),
        "label": roles[0] if roles else grid_label(head["dominant"]),
        "fallback": grid_label(head["dominant"]),  # the label while the legend hides its roles
        "line": f"L{head['layer']}H{head['head']} · {describe_components(head['components'])} · "
        f"explained {_ci(head['explained'])}" + (f" · roles {', '.join(roles)}" if roles else ""),
        "kind": head["dominant_kind"],
        "template": head["dominant"],
        "roles": ",".join(roles),
        "share": f"{share:.4f}",
        "templates": ",".join(sorted({c["name"] for c in head["components"]})),
    }


def _svg_bars_by_layer(atlas: Atlas) -> str:
    """Dominant kind per layer as stacked bars (one bar per layer, a segment per kind)."""
    by_layer = atlas.by_layer()
    n_heads = atlas.layout["heads"]
    width, bar, height = 16 + 14 * len(by_layer), 10, 110
    parts = []
    for i, (layer, row) in enumerate(by_layer.items()):
        y = height - 10
        for kind in KINDS:
            count = row.get(kind, 0)
            if not count:
                continue
            h = 90 * count / n_heads
            y -= h
            parts.append(
                f"<rect x='{16 + 14 * i}' y='{y:.1f}' width='{bar}' height='{h:.1f}' "
                f"fill='{KIND_COLORS[kind]}'><title>L{layer}: {count} {kind}</title></rect>"
            )
        if i % 5 == 0:
            parts.append(f"<text x='{16 + 14 * i}' y='{height}'>{layer}</text>")
    return (
        f"<figure data-testid=plot-kinds><figcaption>dominant kind per layer (heads)</figcaption>"
        f"<svg width='{width}' height='{height + 4}' role=img aria-label='dominant kind per layer'>"
        f"<text x='0' y='12'>{n_heads}</text>{''.join(parts)}</svg></figure>"
    )


def _svg_histogram(atlas: Atlas) -> str:
    values = [h["explained"]["value"] for h in atlas.heads if h["explained"]["value"] is not None]
    counts, _ = np.histogram(values, bins=20, range=(0, 1))
    top = max(int(counts.max()), 1) if len(values) else 1
    parts = [
        f"<rect x='{10 + 12 * i}' y='{100 - 90 * c / top:.1f}' width='11' height='{90 * c / top:.1f}' "
        f"fill='#4dabf7'><title>{i / 20:.2f}–{(i + 1) / 20:.2f}: {c} heads</title></rect>"
        for i, c in enumerate(counts.tolist())
    ]
    return (
        "<figure data-testid=plot-histogram><figcaption>explained share (heads)</figcaption>"
        f"<svg width='260' height='114' role=img aria-label='histogram of explained shares'>{''.join(parts)}"
        f"<text x='10' y='112'>0</text><text x='124' y='112'>0.5</text><text x='240' y='112'>1</text>"
        f"<text x='0' y='10'>{top}</text></svg></figure>"
    )


def _svg_by_layer(atlas: Atlas) -> str:
    """Mean explained share by layer, with (all attention) and without the first token."""
    layers = atlas.layout["layers"]
    width = 20 + 12 * layers

    def line(key: str, color: str) -> str:
        points = []
        for layer in range(layers):
            values = [
                h[key]["value"] for h in atlas.heads if h["layer"] == layer and h[key]["value"] is not None
            ]
            if values:
                points.append(f"{20 + 12 * layer},{100 - 90 * float(np.mean(values)):.1f}")
        return f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{' '.join(points)}'/>"

    return (
        "<figure data-testid=plot-layers><figcaption>mean explained share by layer: "
        "<span style='color:#1c7ed6'>all attention</span>, "
        "<span style='color:#e8590c'>off the first token</span></figcaption>"
        f"<svg width='{width}' height='114' role=img aria-label='mean explained share by layer'>"
        f"<line x1='20' x2='{width}' y1='100' y2='100' stroke='#ccc'/><line x1='20' x2='{width}' y1='10' "
        f"y2='10' stroke='#eee'/><text x='0' y='14'>1</text><text x='0' y='104'>0</text>"
        + line("explained", "#1c7ed6")
        + line("explained_off_first", "#e8590c")
        + f"<text x='20' y='112'>L0</text><text x='{width - 30}' y='112'>L{layers - 1}</text></svg></figure>"
    )


def atlas_html(atlas: Atlas) -> str:
    """describe's section of the report, above the grid: the summary, the summary plots (in place of
    a table of counts) and the colour legend."""
    legend = "".join(
        f"<span><i style='background:{KIND_COLORS[k]}'></i>{k}</span>"
        for k in KINDS
        if any(h["dominant_kind"] == k for h in atlas.heads)
    )
    return (
        f"<section class=describe data-testid=atlas-summary><h2>Every head described</h2>"
        f"<p>{html.escape(summary_line(atlas))}</p>"
        + "".join(f"<p class=muted>{html.escape(line)}</p>" for line in card_notes(atlas))
        + "<div class=atlas-summary>"
        + _svg_bars_by_layer(atlas)
        + _svg_histogram(atlas)
        + _svg_by_layer(atlas)
        + "</div>"
        + f"<p class=kind-legend>grid: colour the dominant kind, lighter where the description explains "
        f"less; a framed cell has a detector role. {legend}</p></section>"
    )


def card_templates(
    atlas: Any, paint: bool = False, beside: Atlas | None = None, heatmaps: bool = True
) -> str | None:
    """A hidden block of one ``<template data-head-card="layer,head">`` per described head: the
    report's head panel shows the one of the head it opens, and, with ``paint`` (describe's own
    page), the grid draws each cell from its ``data-*`` (:func:`cell_attributes`: colour by dominant
    kind, tooltip, filters). ``beside``: another model's atlas; each card then sits beside the card
    of that model's most similar head (:func:`~.atlas.nearest_heads`), with their distance, and
    every head of that model gets a card of its own (``<template data-beside-card="layer,head">``,
    opened from its grid in :func:`beside_html` or at ``#b-L3H1``) beside a link to this model's
    most similar head.
    ``heatmaps``: False leaves the cards' two heatmaps out (scan's report has heatmaps of its own).
    ``atlas``: an :class:`Atlas` or its JSON. None without one; an entry of a saved atlas that does
    not fit a card (a file edited by hand) gets none, and the page says so."""
    if atlas is None:
        return None
    heads = atlas.get("heads") if isinstance(atlas, dict) else getattr(atlas, "heads", None)
    if not isinstance(heads, list) or not heads:
        return None
    fit = atlas.get("fit") if isinstance(atlas, dict) else getattr(atlas, "fit", None)
    counts = fit.get("query_classes") if isinstance(fit, dict) else None
    counts = counts if isinstance(counts, dict) else None
    excerpts = atlas.get("excerpts") if isinstance(atlas, dict) else getattr(atlas, "excerpts", None)
    excerpts = excerpts if heatmaps else None
    nearest = nearest_heads(atlas, beside) if beside is not None and isinstance(atlas, Atlas) else {}
    templates, unfit = [], []
    for index, head in enumerate(heads):
        try:
            key = f"{int(head['layer'])},{int(head['head'])}"
            card = head_card(head, counts, excerpt_maps(excerpts, head), shared_labels="a")
            if beside is not None and (head["layer"], head["head"]) in nearest:
                other, distance = nearest[(head["layer"], head["head"])]
                name = f"L{other['layer']}H{other['head']}"
                card = (  # the partner's card is held once in the page (data-labels), as the axes are
                    f"<div class=pair><div>{card}</div><div class=partner><p data-testid=partner "
                    f"data-partner='{name}' data-distance='{distance}'>most similar head of "
                    f"{html.escape(beside.model)}: <a href='#b-{name}'><b>{name}</b></a>, distance "
                    f"{distance:.2f} (total variation between the two descriptions)</p>"
                    f"<div data-labels='b:{name}'></div></div></div>"
                )
            cells = cell_attributes(head) if paint else {}
            attributes = "".join(f' data-{k}="{html.escape(v, quote=True)}"' for k, v in cells.items())
            templates.append(f'<template data-head-card="{key}"{attributes}>{card}</template>')
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            unfit.append(f"heads[{index}] ({type(exc).__name__}: {exc})")
    note = ""
    if unfit:
        shown = "; ".join(unfit[:3]) + (f"; and {len(unfit) - 3} more" if len(unfit) > 3 else "")
        note = (
            f'<p class="notes" data-testid="head-cards-unfit">describe cards: {len(unfit)} of the '
            f"saved atlas' head entries do not fit a card, and their heads' panels show none: "
            f"{html.escape(shown)}</p>\n"
        )
    painted = ' data-paint="kind"' if paint else ""
    if beside is not None and isinstance(atlas, Atlas):
        templates.extend(_beside_cards(atlas, beside))
    # Each excerpt's axis labels once, for every card that draws it (report.js fills them in).
    shared = [("a", excerpts or []), ("b", (beside.excerpts or []) if beside is not None else [])]
    for prefix, found in shared:
        for number, excerpt in enumerate(found):
            keys, queries = axis_labels(excerpt["tokens"])
            templates.append(f'<template data-labels="x{prefix}{number}">{keys}</template>')
            templates.append(f'<template data-labels="y{prefix}{number}">{queries}</template>')
    return (
        f"<style>\n{CARD_CSS}</style>\n{note}"
        f'<div id="head-cards" hidden data-testid="head-cards" aria-hidden="true" '
        f'title="describe cards"{painted}>{"".join(templates)}</div>\n'
    )


def _beside_cards(a: Atlas, b: Atlas) -> list[str]:
    """Every head of ``b``: its card, held once (``data-labels="b:L3H1"``: ``a``'s cards name it
    as their partner), and its own panel (``data-beside-card``): that card beside a link to the
    head of ``a`` whose description is closest, with their distance."""
    back = nearest_heads(b, a)
    fit_b = b.fit.get("query_classes")
    out = []
    for head in b.heads:
        layer, index = int(head["layer"]), int(head["head"])
        name = f"L{layer}H{index}"
        card = head_card(head, fit_b, excerpt_maps(b.excerpts, head), "b")
        other, distance = back[(layer, index)]
        near = f"L{other['layer']}H{other['head']}"
        out.append(f'<template data-labels="b:{name}">{card}</template>')
        out.append(
            f'<template data-beside-card="{layer},{index}" data-model="{html.escape(b.model, quote=True)}">'
            f"<div class=pair><div data-labels='b:{name}'></div><div class=partner><p "
            f"data-testid=nearest data-nearest='{near}' data-distance='{distance}'>most similar head of "
            f"{html.escape(a.model)}: <a href='#{near}'><b>{near}</b></a>, distance {distance:.2f} (total "
            "variation between the two descriptions)</p></div></div></template>"
        )
    return out


def beside_html(a: Atlas, b: Atlas) -> str:
    """Two models' grids side by side, aligned by relative depth (a layer's top at its depth in its
    model, 0 to 1), each cell coloured as the page's grid, and each layer's dominant kinds as a
    stacked bar beside it."""
    height, cell = 360, 9

    def column(atlas: Atlas, x: float, side: str) -> tuple[str, float]:
        layers, n_heads = atlas.layout["layers"], atlas.layout["heads"]
        row = height / layers
        parts = [f"<text x='{x}' y='12'>{html.escape(atlas.model)}</text>"]
        by_layer = atlas.by_layer()
        for head in atlas.heads:
            share = head["explained"]["value"] or 0.0
            name = f"L{head['layer']}H{head['head']}"
            parts.append(  # a cell opens its head's panel (report.js): side a, the page's own
                f"<rect x='{x + head['head'] * cell:.1f}' y='{20 + head['layer'] * row:.1f}' width='{cell - 1}' "
                f"height='{max(row - 1, 1):.1f}' fill='{cell_color(head['dominant_kind'], share)}' "
                f"class=beside-cell data-testid=beside-cell data-side={side} data-layer='{head['layer']}' "
                f"data-head='{head['head']}' tabindex=0 role=button aria-label='{name} of "
                f"{html.escape(atlas.model, quote=True)}'><title>"
                f"{name}: {html.escape(head['dominant'])}, explained {share:.2f}"
                "</title></rect>"
            )
        bars = x + n_heads * cell + 4
        for layer, counts in by_layer.items():
            at = bars
            for kind in KINDS:
                width = 40 * counts.get(kind, 0) / n_heads
                if width:
                    parts.append(
                        f"<rect x='{at:.1f}' y='{20 + int(layer) * row:.1f}' width='{width:.1f}' "
                        f"height='{max(row - 1, 1):.1f}' fill='{KIND_COLORS[kind]}'><title>L{layer}: "
                        f"{counts[kind]} {kind}</title></rect>"
                    )
                    at += width
        return "".join(parts), bars + 50

    left, end = column(a, 30, "a")
    right, total = column(b, end + 20, "b")
    ticks = "".join(
        f"<text x='0' y='{20 + f * height + 4:.0f}'>{f:.2g}</text>"
        f"<line x1='24' x2='{total}' y1='{20 + f * height:.0f}' y2='{20 + f * height:.0f}' stroke='#eee'/>"
        for f in (0, 0.25, 0.5, 0.75, 1)
    )
    return (
        f"<section class=describe data-testid=beside><h2>{html.escape(a.model)} beside "
        f"{html.escape(b.model)}</h2><p>Both grids by relative depth (0: the first layer, 1: the end of "
        "the last), each cell coloured as the grid below, with each layer's dominant kinds beside it. "
        f"The grid below is {html.escape(a.model)}'s: each head's card sits beside the card of "
        f"{html.escape(b.model)}'s head whose description is closest. A cell of either grid here "
        f"opens its head's card.</p><svg width='{total:.0f}' "
        f"height='{height + 30}' role=img aria-label='both grids by relative depth'>{ticks}{left}{right}"
        "</svg></section>"
    )


class HeadCard:
    """One head's card (``Result.card("L18H6")``): the card with its heatmaps inline in Jupyter
    (``_repr_html_``, plain HTML and CSS, no script), a line of text elsewhere."""

    def __init__(self, atlas: Atlas, layer: int, head: int) -> None:
        self.atlas, self.entry = atlas, atlas.head(layer, head)

    @property
    def maps(self) -> dict[str, Any] | None:
        """The two heatmaps' data (:func:`~.atlas.excerpt_maps`), or None for an atlas without them."""
        return excerpt_maps(self.atlas.excerpts, self.entry)

    def html(self) -> str:
        card = head_card(self.entry, self.atlas.fit.get("query_classes"), self.maps)
        return f"<div class=head-card><style>{CARD_CSS}</style>{card}</div>"

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return f"<headscope card of {self.atlas.model}: {cell_attributes(self.entry)['line']}>"
