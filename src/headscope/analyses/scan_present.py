"""``headscope scan`` in the HTML report: each head's describe card (the atlas scan computes for
heads without a working role), shown in the head panel when the head is clicked."""

from __future__ import annotations

from typing import Any

from headscope.extend.render import html_text

CARD_CSS = """/* describe cards in the head panel (scan reports with an atlas) */
.head-card .card { border: 1px solid rgba(0, 0, 0, 0.15); border-radius: 6px; padding: 0.4rem 0.7rem; margin: 0.6rem 0; }
.head-card .card h3 { font-size: 0.95rem; margin: 0.2rem 0; }
.head-card .desc { font-family: monospace; font-size: 0.85rem; }
.head-card .bar { background: #eee; height: 0.5em; width: 12rem; }
.head-card .bar span { display: block; height: 100%; background: #4dabf7; }
.head-card .k b { color: #c92a2a; } .head-card .q b { color: #1864ab; }
.head-card .win { color: var(--muted, #555); font-size: 90%; }
"""


def head_cards(atlas: Any) -> str | None:
    """A hidden block of one ``<template data-head-card="layer,head">`` per described head (the
    report's head panel shows the one of the head it opens); None without an atlas. An entry of a
    saved atlas that does not fit a card (a file edited by hand) gets none, and the page says so."""
    if atlas is None:
        return None
    from .describe.present import head_card

    heads = atlas.get("heads") if isinstance(atlas, dict) else getattr(atlas, "heads", None)
    if not isinstance(heads, list) or not heads:
        return None
    fit = atlas.get("fit") if isinstance(atlas, dict) else getattr(atlas, "fit", None)
    counts = fit.get("query_classes") if isinstance(fit, dict) else None
    counts = counts if isinstance(counts, dict) else None
    templates, unfit = [], []
    for index, head in enumerate(heads):
        try:
            key = f"{int(head['layer'])},{int(head['head'])}"
            templates.append(f'<template data-head-card="{key}">{head_card(head, counts)}</template>')
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            unfit.append(f"heads[{index}] ({type(exc).__name__}: {exc})")
    note = ""
    if unfit:
        shown = "; ".join(unfit[:3]) + (f"; and {len(unfit) - 3} more" if len(unfit) > 3 else "")
        note = (
            f'<p class="notes" data-testid="head-cards-unfit">describe cards: {len(unfit)} of the '
            f"saved atlas' head entries do not fit a card, and their heads' panels show none: "
            f"{html_text(shown)}</p>\n"
        )
    return (
        f"<style>\n{CARD_CSS}</style>\n{note}"
        f'<div id="head-cards" hidden data-testid="head-cards" aria-hidden="true" '
        f'title="{html_text("describe cards")}">{"".join(templates)}</div>\n'
    )
