"""How ``describe`` shows itself: the terminal tables and the HTML page of cards."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from headscope import files

from .atlas import KINDS, Atlas, describe_components
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


def head_card(head: dict[str, Any], fit_counts: dict[str, int] | None = None) -> str:
    esc = html.escape
    rows = []
    for context in head["contexts"]:
        arrows = "".join(
            f"<li><span class=k>{esc(a['before'])}<b>{esc(a['key_token'])}</b></span> … "
            f"<span class=q>{esc(a['between'][-30:])}<b>{esc(a['query_token'])}</b></span> "
            f"<span class=w style='opacity:{0.3 + 0.7 * a['weight']:.2f}'>{a['weight']:.2f}</span></li>"
            for a in context["arrows"]
        )
        rows.append(
            f"<div class=ctx><div class=win>{esc(context['window'])}: "
            f"{context['off_first']:.2f} off the first token</div><ol>{arrows}</ol></div>"
        )
    explained = head["explained"]
    bar = f"<div class=bar><span style='width:{100 * explained['value']:.0f}%'></span></div>"
    return (
        f"<section class=card id='L{head['layer']}H{head['head']}'>"
        f"<h3>L{head['layer']}H{head['head']} <small>KV group {head['kv_group']}</small> — {esc(head['dominant'])}</h3>"
        f"<p class=desc>{esc(describe_components(head['components'], fit_counts=fit_counts))}</p>"
        f"{bar}<p>explains {_ci(explained)} of its attention on evaluation text and leaves {head['left']:.2f}; "
        f"off the first token {_off_first(head)}; on the first token {head['first_token']:.2f}. "
        f"Roles: {esc(', '.join(head['roles']) or 'none')}.</p>"
        + "".join(f"<p class=card-{cls}>{esc(line)}</p>" for cls, line in _card_lines(head))
        + f"<details><summary>top contexts (strongest key, off the first token, of its strongest queries)</summary>"
        f"{''.join(rows)}</details></section>"
    )


def _card_lines(head: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's lines on what the head writes (or why that was not read) and whether it matters."""
    lines = [("writes", writes_line(head)), ("matters", matters_line(head)), ("why", why_line(head))]
    return [(cls, line) for cls, line in lines if line]


def _off_first(head: dict[str, Any]) -> str:
    entry = head["explained_off_first"]
    if entry.get("value") is None:
        return "none to explain (all its attention is on the first token)"
    return _ci(entry)


STYLE = """
body{font-family:system-ui,'Noto Sans CJK SC',sans-serif;margin:2em;max-width:70em}
.card{border:1px solid #ccc;border-radius:6px;padding:.6em 1em;margin:.6em 0}
.desc{font-family:monospace}.bar{background:#eee;height:.5em;width:20em}
.bar span{display:block;height:100%;background:#4dabf7}.k b{color:#c92a2a}.q b{color:#1864ab}
.win{color:#555;font-size:90%}table{border-collapse:collapse}td,th{padding:0 .5em;text-align:right}
"""


def atlas_html(atlas: Atlas) -> str:
    """The cards as one HTML section (every head's description, shares and top contexts)."""
    by_layer = atlas.by_layer()
    header = "".join(f"<th>{k}</th>" for k in KINDS)
    body = "".join(
        f"<tr><td>{layer}</td>" + "".join(f"<td>{row.get(k, 0) or ''}</td>" for k in KINDS) + "</tr>"
        for layer, row in by_layer.items()
    )
    return (
        f"<section class=describe><h2>Every head described</h2><p>{html.escape(summary_line(atlas))}</p>"
        + "".join(f"<p>{html.escape(line)}</p>" for line in card_notes(atlas))
        + f"<table><tr><th>layer</th>{header}</tr>{body}</table>"
        + "".join(head_card(head, atlas.fit.get("query_classes")) for head in atlas.heads)
        + "</section>"
    )


def page(atlas: Atlas) -> str:
    title = html.escape(f"{atlas.model}: every head described")
    data = html.escape(json.dumps({"schema": atlas.to_json()["schema"], "model": atlas.model}))
    return (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>{title}</title>"
        f"<style>{STYLE}</style><body data-atlas='{data}'><h1>{title}</h1>{atlas_html(atlas)}</body></html>\n"
    )


def write_html(result: Any, path: Path, force: bool) -> str:
    files.write_atomic(path, page(result.atlas), "--html", force)
    return str(path)
