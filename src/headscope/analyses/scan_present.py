"""``headscope scan`` in the HTML report: each head's describe card (the atlas scan computes for
heads without a working role), shown in the head panel when the head is clicked."""

from __future__ import annotations

from typing import Any


def head_cards(atlas: Any) -> str | None:
    """The describe card of each head (:func:`~.describe.present.card_templates`), for the report's
    head panel; the grid keeps scan's role colours, and the cards leave out describe's two heatmaps
    (the report draws each head's attention on its own examples). None without an atlas."""
    from .describe.present import card_templates

    return card_templates(atlas, heatmaps=False)
