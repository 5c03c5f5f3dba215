"""Choosing heads: the top k of a results table, and random controls for an ablation.

Pure functions of a table, or a layout and a seeded ``random.Random``; nothing here runs a model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from headscope.errors import InputError
from headscope.models import HeadLayout

Head = tuple[int, int]


def random_control(top: Sequence[Head], layout: HeadLayout, rng: random.Random) -> list[Head]:
    """As many random heads as ``top``, each from the layer of a top head, never a top head itself.

    When a layer has no other head left, the draw falls back to any non-top head of the model.
    """
    excluded = set(top)
    chosen: list[Head] = []
    for layer, _ in top:
        options = [(layer, h) for h in range(layout.n_heads) if (layer, h) not in excluded]
        if not options:
            options = [
                (lay, h)
                for lay in range(layout.n_layers)
                for h in range(layout.n_heads)
                if (lay, h) not in excluded
            ]
        if not options:
            raise InputError("no heads are left to draw a random control from; lower --ablate")
        pick = rng.choice(options)
        chosen.append(pick)
        excluded.add(pick)
    return sorted(chosen)


def top_heads(table: Any, detector: str, k: int, data: str | None = None) -> list[Head]:
    """The k best heads of one detector in a results table."""
    rows = table[table.detector == detector]
    if data is not None:
        rows = rows[rows.data == data]
    rows = rows.sort_values("score", ascending=False).head(k)
    return [(int(r.layer), int(r.head)) for r in rows.itertuples()]
