"""The head-role map: which heads have a role we can vouch for, and which role is strongest.

A head gets the role of a (data, detector, relation, direction) group only when all three hold:

1. its score is at least ``threshold`` (default 0.3);
2. its 95% interval's lower end clears the group's reference by ``margin`` (default 0.05); the
   reference is the baseline, or chance where chance is higher (coreference sets in which the
   nearest candidate is usually wrong);
3. it is significant after correcting for the L×H heads tested in the group: the one-sided
   p-value of "score > reference + margin" (normal approximation with the bootstrap standard
   error) stays below ``alpha`` (default 0.05) after Benjamini–Hochberg over all heads of the group.

Among the roles a head qualifies for, the strongest is the one with the largest share of the
headroom above its reference, ``(score - reference) / (1 - reference)``. "sink" counts only when
a head has no other role: parking attention on the first token is what heads do when their
pattern is absent (an induction head on text without repeats is a sink head), so it is the
resting state, not a job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from headscope.verdicts.stats import benjamini_hochberg, one_sided_p

DETECTOR_LABELS = {
    "previous-token": "prev",
    "duplicate-token": "dup",
    "induction": "ind",
    "sink": "sink",
    "coref": "coref",
}
RELATION_LABELS = {"nsubj": "subj", "advmod": "adv"}

GROUP = ["data", "detector", "relation", "direction"]
RESTING_ROLE = "sink"


@dataclass(frozen=True)
class RoleRule:
    threshold: float = 0.3
    margin: float = 0.05
    alpha: float = 0.05

    def describe(self) -> str:
        return (
            f"a head gets a role when score ≥ {self.threshold:g}, ci_low ≥ reference + {self.margin:g} "
            "(reference: the baseline, or chance / first candidate where higher), and the "
            f"Benjamini–Hochberg-adjusted p < {self.alpha:g} over the heads of each table; "
            "sink only when no other role qualifies"
        )


def role_label(detector: str, relation: str) -> str:
    if detector == "syntax":
        return RELATION_LABELS.get(relation, relation[:5])
    return DETECTOR_LABELS.get(detector, detector[:5])


def assign_roles(table: pd.DataFrame, rule: RoleRule | None = None) -> pd.DataFrame:
    """Fill ``role`` (the row's label where the head qualifies) and add ``p_adj`` and ``strength``."""
    rule = rule or RoleRule()
    table = table.copy()
    table["p_adj"] = np.nan
    table["strength"] = np.nan
    table["role"] = ""
    for _, index in table.groupby(GROUP, sort=False).groups.items():
        group = table.loc[index]
        baseline = group["role_null"].astype(float)
        p = one_sided_p(
            group["score"].to_numpy(float), (baseline + rule.margin).to_numpy(), group["se"].to_numpy(float)
        )
        p_adj = benjamini_hochberg(p)
        headroom = (1.0 - baseline).clip(lower=1e-9)
        strength = (group["score"] - baseline) / headroom
        qualifies = (
            (group["score"] >= rule.threshold)
            & (group["ci_low"] >= baseline + rule.margin)
            & (p_adj < rule.alpha)
        )
        first = group.iloc[0]
        label = role_label(first["detector"], first["relation"])
        table.loc[index, "p_adj"] = p_adj
        table.loc[index, "strength"] = strength.to_numpy()
        table.loc[index, "role"] = np.where(qualifies.to_numpy(), label, "")
    return table


def head_roles(table: pd.DataFrame) -> pd.DataFrame:
    """One row per head: its strongest qualifying role (empty when none) and the score behind it."""
    heads = table[["model", "layer", "head", "kv_group"]].drop_duplicates(["layer", "head"])
    qualified = table[table["role"] != ""].copy()
    qualified["resting"] = qualified["role"] == RESTING_ROLE
    qualified = qualified.sort_values(["resting", "strength"], ascending=[True, False])
    best = qualified.drop_duplicates(["layer", "head"])
    columns = [c for c in ROLES_CSV_COLUMNS if c not in {"model", "kv_group", "n_roles"}]
    merged = heads.merge(best[columns], on=["layer", "head"], how="left")
    counts = qualified.groupby(["layer", "head"]).size().rename("n_roles")
    merged = merged.merge(counts, on=["layer", "head"], how="left")
    merged["n_roles"] = merged["n_roles"].fillna(0).astype(int)
    merged["role"] = merged["role"].fillna("")
    return merged.sort_values(["layer", "head"]).reset_index(drop=True)


ROLES_CSV_COLUMNS = [
    "model",
    "layer",
    "head",
    "kv_group",
    "role",
    "n_roles",
    "data",
    "detector",
    "relation",
    "direction",
    "score",
    "baseline",
    "ci_low",
    "ci_high",
    "p_adj",
    "n",
]
