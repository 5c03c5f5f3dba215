"""The tidy results table: one row per head per (detector, relation, direction)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from headscope.detectors.base import DetectorResult
from headscope.models import HeadLayout
from headscope.verdicts.stats import bootstrap_ratio, interval_unavailable_reason

CSV_COLUMNS = [
    "model",
    "detector",
    "relation",
    "direction",
    "layer",
    "head",
    "kv_group",
    "score",
    "baseline",
    "ci_low",
    "ci_high",
    "n",
    "rank",
    "role",
    "data",
]


HIDDEN_COLUMNS = ["se", "role_null"]


def head_table(
    results: Sequence[DetectorResult],
    layout: HeadLayout,
    model_name: str,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Turn detector results into the tidy table. Rank 1 is the highest score in its group."""
    frames = []
    for result in results:
        if result.n == 0:  # nothing counted: a 0/0 is no score (uncertainty_notes says so), never 0.0
            continue
        scores = result.scores().numpy()
        low, high, se = bootstrap_ratio(result.sums, result.counts, n_resamples=n_resamples, seed=seed)
        layers, heads = layout.n_layers, layout.n_heads
        by_layer = result.baseline_by_layer()
        baseline = np.full(layers * heads, np.nan) if by_layer is None else np.repeat(by_layer.numpy(), heads)
        # The strongest "no role" reference: the baseline, or chance where it is higher (coref).
        role_null = np.fmax(np.nan_to_num(baseline, nan=0.0), max([0.0, *result.extras.values()]))
        rows = {
            "model": model_name,
            "detector": result.detector,
            "relation": result.relation,
            "direction": result.direction,
            "layer": [layer for layer in range(layers) for _ in range(heads)],
            "head": [head for _ in range(layers) for head in range(heads)],
            "kv_group": [layout.kv_group(head) for _ in range(layers) for head in range(heads)],
            "score": scores.reshape(-1),
            "baseline": baseline,
            "ci_low": low.reshape(-1),
            "ci_high": high.reshape(-1),
            "n": result.n,
            "role": "",
            "data": result.data,
            "se": se.reshape(-1),
            "role_null": role_null,
        }
        frame = pd.DataFrame(rows)
        # Hybrid models (Jamba, Qwen3-Next): layers without softmax attention have no heads to score.
        attending = set(getattr(layout, "attention_layers", range(layers)))
        if len(attending) < layers:
            frame = frame[frame["layer"].isin(attending)].reset_index(drop=True)
        frame["rank"] = frame["score"].rank(ascending=False, method="first").astype(int)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*CSV_COLUMNS, *HIDDEN_COLUMNS])
    # `se` (bootstrap standard error) and `role_null` feed the role test; they are not CSV columns.
    return pd.concat(frames, ignore_index=True)[[*CSV_COLUMNS, *HIDDEN_COLUMNS]]


def uncertainty_notes(results: Sequence[DetectorResult], n_resamples: int) -> list[str]:
    """One line per table whose scores carry no interval (and so no role), saying why; and one per
    table left out because nothing was counted (a detector whose targets never occur in the data)."""
    notes = [
        f"{result.data}: {' · '.join(p for p in (result.detector, result.relation, result.direction) if p)}: "
        "not scored: nothing in the data to score (n = 0; a detector's targets never occur in it)"
        for result in results
        if result.n == 0
    ]
    if n_resamples == 0:
        return notes + (["--resamples 0: scores without intervals, and so without roles"] if results else [])
    for result in results:
        if not result.interval:
            continue
        reason = interval_unavailable_reason(result.n_examples, n_resamples)
        if reason is not None and result.n > 0:
            name = " · ".join(p for p in (result.detector, result.relation, result.direction) if p)
            notes.append(f"{result.data}: {name}: {reason}")
    return notes
