"""``headscope scan`` in the HTML report: each head's describe card (the atlas scan computes for
heads without a working role), shown in the head panel when the head is clicked."""

from __future__ import annotations

from typing import Any

from .render import html_text

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
    report's head panel shows the one of the head it opens); None without an atlas."""
    if atlas is None:
        return None
    # describe's own card (describe/present.py is another module's: its private _card, used as is)
    from .describe.present import _card as head_card

    heads = atlas.get("heads") if isinstance(atlas, dict) else atlas.heads
    if not heads:
        return None
    templates = "".join(
        f'<template data-head-card="{int(h["layer"])},{int(h["head"])}">{head_card(h)}</template>'
        for h in heads
    )
    return (
        f"<style>\n{CARD_CSS}</style>\n"
        f'<div id="head-cards" hidden data-testid="head-cards" aria-hidden="true" '
        f'title="{html_text("describe cards")}">{templates}</div>\n'
    )
