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

What each role is (label, meaning, colour, style, verification target) is declared where the role is
defined: a detector's ``role``/``roles`` (``headscope.detectors``), the weights tables' ``ROLES``
(``headscope.weightroles.summaries``). :func:`role_spec` and :func:`spec_for_label` look them up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from headscope import detectors
from headscope.core.rolespec import RoleSpec
from headscope.detectors.positional import SINK_ROLE
from headscope.verdicts.stats import benjamini_hochberg, one_sided_p
from headscope.weightroles import summaries as weights_tables

GROUP = ["data", "detector", "relation", "direction"]
RESTING_ROLE = SINK_ROLE.label


def role_spec(detector: str, relation: str) -> RoleSpec | None:
    """The spec of a table's role, from the detector table or the weights tables (None: unknown)."""
    if detector == weights_tables.DETECTOR:
        return weights_tables.ROLES.get(relation)
    cls = detectors.declared(detector)
    return cls.role_spec(relation) if cls is not None else None


def role_specs() -> dict[str, RoleSpec]:
    """Every role a head can be given, by label (first declared wins; descriptive tables name none)."""
    declared = [spec for cls in detectors.DECLARATIONS.values() for spec in cls.role_specs()]
    declared += list(weights_tables.ROLES.values())
    index: dict[str, RoleSpec] = {}
    for spec in declared:
        if spec.kind == "descriptive":
            continue
        for labelled in spec.labels():
            index.setdefault(labelled.label, labelled)
    return index


def spec_for_label(label: str) -> RoleSpec:
    """The spec behind a role label; a label nobody declared (a syntax relation outside the named
    ones) gets a plain spec: the label as its meaning, the default colour and style."""
    return role_specs().get(label) or RoleSpec(label, label)


@dataclass(frozen=True)
class RoleRule:
    threshold: float = 0.3
    margin: float = 0.05
    alpha: float = 0.05
    dla_min: float = 0.1  # nats: a name mover moves at least this much logit difference
    patch_min: float = 0.05  # attention: an S-inhibition head moves the name movers at least this much
    aie_min: float = 0.01  # probability: a function-vector head's mean output restores at least this much

    def describe(self) -> str:
        return (
            f"a head gets a role when score ≥ {self.threshold:g}, ci_low ≥ reference + {self.margin:g} "
            "(reference: the baseline, or chance / first candidate where higher), and the "
            f"Benjamini–Hochberg-adjusted p < {self.alpha:g} over the heads of each table; "
            "sink only when no other role qualifies; name movers (nm) and negative name movers "
            f"(neg): DLA toward IO against S significantly above (below) 0 and |DLA| ≥ {self.dla_min:g}, "
            "with attention to IO above attention to S1 + S2; S-inhibition (sinh): the path-patching "
            f"effect on the name movers significantly above 0 and ≥ {self.patch_min:g}; function-vector "
            f"heads (fv): the average indirect effect significantly above 0 and ≥ {self.aie_min:g}"
        )


def role_label(detector: str, relation: str) -> str:
    """The label of a table's role (the sweep summary's ``role`` column).

    A signed table names its role by the score's sign (``RoleSpec.labels()``: nm above 0, neg
    below), so the table as a whole goes by its detector's first five letters, as does a detector
    nobody registered.
    """
    spec = role_spec(detector, relation)
    return spec.label if spec is not None and spec.kind != "signed" else detector[:5]


def assign_roles(table: pd.DataFrame, rule: RoleRule | None = None) -> pd.DataFrame:
    """Fill ``role`` (the row's label where the head qualifies) and add ``p_adj`` and ``strength``."""
    rule = rule or RoleRule()
    table = table.copy()
    table["p_adj"] = np.nan
    table["strength"] = np.nan
    table["role"] = ""
    for _, index in table.groupby(GROUP, sort=False).groups.items():
        group = table.loc[index]
        first = group.iloc[0]
        spec = role_spec(first["detector"], first["relation"])
        if spec is not None and spec.kind == "descriptive":
            continue
        if spec is not None and spec.kind == "signed":
            below = spec.negative.label if spec.negative is not None else None
            _signed_roles(table, index, rule, (spec.label, below))
            continue
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
        table.loc[index, "p_adj"] = p_adj
        table.loc[index, "strength"] = strength.to_numpy()
        label = role_label(first["detector"], first["relation"])
        table.loc[index, "role"] = np.where(qualifies.to_numpy(), label, "")
    return table


def _signed_roles(
    table: pd.DataFrame, index: pd.Index, rule: RoleRule, labels: tuple[str, str | None]
) -> None:
    """Roles for a signed score (DLA in nats, a patching effect): two-sided, BH over the group."""
    group = table.loc[index]
    score = group["score"].to_numpy(float)
    se = group["se"].to_numpy(float)
    zero = np.zeros_like(score)
    p = np.minimum(1.0, 2.0 * np.minimum(one_sided_p(score, zero, se), one_sided_p(-score, zero, se)))
    p_adj = benjamini_hochberg(p)
    first = group.iloc[0]
    minimum = {"dla": rule.dla_min, "aie": rule.aie_min}.get(first["relation"], rule.patch_min)
    significant = p_adj < rule.alpha
    up = significant & (group["ci_low"].to_numpy(float) > 0) & (score >= minimum)
    down = significant & (group["ci_high"].to_numpy(float) < 0) & (score <= -minimum)
    if first["detector"] == "ioi" and first["relation"] == "dla":
        looks = _looks_at_io(table, first["data"], group)
        up, down = up & looks, down & looks
    roles = np.where(up, labels[0], "")
    if labels[1] is not None:
        roles = np.where(down, labels[1], roles)
    peak = max(float(np.abs(score).max()), 1e-12)
    table.loc[index, "p_adj"] = p_adj
    table.loc[index, "strength"] = np.abs(score) / peak
    table.loc[index, "role"] = roles


def _looks_at_io(table: pd.DataFrame, data: str, group: pd.DataFrame) -> np.ndarray:
    """Per head of ``group``: attention from END to IO above attention to S1 and S2 together."""
    attention = table[(table.data == data) & (table.detector == "ioi") & (table.relation == "attention")]
    wide = attention.pivot_table(index=["layer", "head"], columns="direction", values="score")
    keys = list(zip(group["layer"], group["head"], strict=True))
    if not {"io", "s1", "s2"} <= set(wide.columns):
        # An attention table with nothing counted is left out (n = 0, said in a note): no head was
        # seen looking at IO, so none qualifies as a name mover by attention.
        return np.zeros(len(keys), dtype=bool)
    io = wide["io"].reindex(keys).to_numpy(float)
    s = (wide["s1"] + wide["s2"]).reindex(keys).to_numpy(float)
    return np.nan_to_num(io) > np.nan_to_num(s)


def head_roles(table: pd.DataFrame) -> pd.DataFrame:
    """One row per head: its strongest qualifying role (empty when none) and the score behind it."""
    return _per_head(table, table[table["role"] != ""].copy())


def roles_from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`head_roles` for saved rows (a result JSON without its role table), which carry no
    strength or adjusted p-value: strength is the share of headroom above the row's baseline."""
    held = rows[rows["role"].fillna("") != ""].copy()
    base = held["baseline"].astype(float).fillna(0.0)
    held["strength"] = (held["score"].astype(float) - base) / (1.0 - base).clip(lower=1e-9)
    if "p_adj" not in held:
        held["p_adj"] = np.nan
    return _per_head(rows, held)


def _per_head(table: pd.DataFrame, qualified: pd.DataFrame) -> pd.DataFrame:
    """Each head's strongest row of ``qualified`` (sink last), its role count and secondary roles."""
    heads = table[["model", "layer", "head", "kv_group"]].drop_duplicates(["layer", "head"])
    qualified["resting"] = qualified["role"] == RESTING_ROLE
    qualified = qualified.sort_values(["resting", "strength"], ascending=[True, False])
    best = qualified.drop_duplicates(["layer", "head"])
    columns = [c for c in ROLES_CSV_COLUMNS if c not in {"model", "kv_group", "n_roles", "secondary"}]
    merged = heads.merge(best[columns], on=["layer", "head"], how="left")
    counts = qualified.groupby(["layer", "head"]).size().rename("n_roles")
    merged = merged.merge(counts, on=["layer", "head"], how="left")
    merged["n_roles"] = merged["n_roles"].fillna(0).astype(int)
    # The other roles a head qualifies for, strongest first (distinct labels, the shown one left out).
    others = qualified.groupby(["layer", "head"], sort=False)["role"].apply(lambda r: list(dict.fromkeys(r)))
    shown = dict(zip(zip(best["layer"], best["head"], strict=True), best["role"], strict=True))
    secondary = {key: ";".join(r for r in labels if r != shown.get(key)) for key, labels in others.items()}
    merged["secondary"] = [
        secondary.get((int(a), int(b)), "") for a, b in zip(merged["layer"], merged["head"], strict=True)
    ]
    merged["role"] = merged["role"].fillna("")
    return merged.sort_values(["layer", "head"]).reset_index(drop=True)


ROLES_CSV_COLUMNS = [
    "model",
    "layer",
    "head",
    "kv_group",
    "role",
    "n_roles",
    "secondary",
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
