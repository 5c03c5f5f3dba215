"""What a sweep's store says: the long table, the emergence table and the cross-model summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from headscope.verdicts.results import CSV_COLUMNS
from headscope.verdicts.roles import role_label

from .specs import Target
from .store import Store

SWEEP_COLUMNS = ["model", "step", "analysis", "series", "n_layers", *CSV_COLUMNS[1:]]
# Model-level numbers an analysis reports beside its heads (Report.measures), one column each: these
# always (the sweep figure reads them), then any other an analysis reports (describe's explained
# share and its dominant kinds of template), in the order first seen.
MEASURE_COLUMNS = ["icl_score", "icl_score_low", "icl_score_high"]


def collect(
    store: Store, targets: Sequence[Target], analyses: Sequence[str]
) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """The long table of every finished run of this sweep, and the repeated-copy losses."""
    frames, losses = [], []
    columns = list(MEASURE_COLUMNS)
    for target in targets:
        for analysis in analyses:
            run_key = f"{target.key}__{analysis}"
            entry = store.runs.get(run_key)
            if not entry or entry.get("status") != "done" or not store.file_of(run_key).exists():
                continue
            payload: dict[str, Any] = store.load(run_key)
            frame = pd.DataFrame(payload["rows"])
            if frame.empty:
                continue
            frame["model"] = target.label
            frame["step"] = target.step
            frame["analysis"] = analysis
            frame["series"] = target.series
            frame["n_layers"] = payload.get("layers")
            frames.append(frame)
            if payload.get("loss") or payload.get("measures"):
                loss = payload.get("loss") or {}
                measures = payload.get("measures") or {}
                columns += [name for name in measures if name not in columns]
                losses.append(
                    {
                        "model": target.label,
                        "series": target.series,
                        "step": target.step,
                        "first": loss.get("first", np.nan),
                        "later": loss.get("later", np.nan),
                        **measures,
                    }
                )
    table = pd.concat(frames, ignore_index=True)[SWEEP_COLUMNS] if frames else None
    if table is not None:
        table["step"] = table["step"].astype("Int64")
    return table, pd.DataFrame(losses, columns=["model", "series", "step", "first", "later", *columns])


def _drop_step(frame: pd.DataFrame, column: str) -> int | None:
    """The step at which ``column`` falls most from the checkpoint before (None: fewer than two)."""
    if column not in frame:
        return None
    part = frame[frame[column].notna()].sort_values("step")
    if len(part) < 2:
        return None
    change = np.diff(part[column].to_numpy(float))
    return int(part["step"].iloc[int(np.argmin(change)) + 1])


def _label(row: Any) -> str:
    return role_label(row["detector"], row["relation"])


def emergence(table: pd.DataFrame, losses: pd.DataFrame) -> pd.DataFrame:
    """Per series with several steps and per role table: when each head first holds the role,
    where the best score rises most, where the repeated-copy loss drops most, and where the ICL score
    (``headscope icl``) drops most."""
    out = []
    stepped = table[table["step"].notna()]
    for series, part in stepped.groupby("series", sort=False):
        steps = sorted(part["step"].unique())
        if len(steps) < 2:
            continue
        loss = losses[losses.series == series]
        drop_step = _drop_step(loss, "later")
        icl_step = _drop_step(loss, "icl_score")
        for keys, group in part.groupby(
            ["analysis", "data", "detector", "relation", "direction"], sort=False
        ):
            best = group.groupby("step")["score"].max().reindex(steps)
            rises = np.diff(best.to_numpy(float))
            rise_step = int(steps[int(np.nanargmax(rises)) + 1]) if np.isfinite(rises).any() else None
            holders = group[group["role"] != ""]
            first = holders.groupby(["layer", "head"])["step"].min().sort_values()
            label = _label(group.iloc[0])
            out.append(
                {
                    "series": series,
                    "analysis": keys[0],
                    "table": " · ".join(str(k) for k in keys[1:] if k),
                    "role": label,
                    "best_first": float(best.iloc[0]),
                    "best_last": float(best.iloc[-1]),
                    "largest_rise_at": rise_step,
                    "largest_rise": float(np.nanmax(rises)) if np.isfinite(rises).any() else None,
                    "copy_loss_drop_at": drop_step,
                    "icl_score_drop_at": icl_step,
                    "first_step_per_head": "; ".join(f"L{lay}H{h}@{s}" for (lay, h), s in first.items()),
                }
            )
    return pd.DataFrame(out)


def across_models(table: pd.DataFrame) -> pd.DataFrame:
    """Per model (the last step of each series): heads per role, and the role's mean depth
    (layer + 0.5) / layers, so models of different depth compare."""
    last = table.sort_values("step").groupby("series", sort=False)["step"].transform("max")
    final = table[(table["step"].isna()) | (table["step"] == last)]
    holders = final[final["role"] != ""].copy()
    if holders.empty:
        return pd.DataFrame(columns=["model", "role", "heads", "depth"])
    holders["depth"] = (holders["layer"] + 0.5) / holders["n_layers"].astype(float)
    unique = holders.drop_duplicates(["model", "role", "layer", "head"])
    summary = unique.groupby(["model", "role"], sort=False).agg(
        heads=("head", "size"), depth=("depth", "mean")
    )
    return summary.reset_index()
