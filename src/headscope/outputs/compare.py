"""Compare two scan CSVs: two models, or two checkpoints of one model.

Rows are matched on (data, detector, relation, direction, layer, head). For each table
(data, detector, relation, direction) the comparison gives the best head on each side, how the
scores of the heads present in both moved (their mean change and Spearman's rank correlation), and
which heads gained or lost the table's role. Heads are matched by position, so two results of
different layouts (layers x heads) are refused; tables found in one result only are named in
``notes``, and two results that share no table are refused.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headscope.data.prompts import display_path
from headscope.errors import InputError

REQUIRED = ["model", "detector", "relation", "direction", "layer", "head", "score"]
OPTIONAL = ["kv_group", "baseline", "ci_low", "ci_high", "n", "rank", "role", "data"]
TABLE = ["data", "detector", "relation", "direction"]
KEY = [*TABLE, "layer", "head"]

JOINED_COLUMNS = [
    *TABLE,
    "layer",
    "head",
    "score_a",
    "score_b",
    "delta",
    "ci_low_a",
    "ci_high_a",
    "ci_low_b",
    "ci_high_b",
    "role_a",
    "role_b",
    "change",
]


class CompareInputError(InputError):
    """A scan CSV that cannot be compared."""


def _float(value: str, where: str, column: str, required: bool) -> float:
    if value == "" and not required:
        return math.nan
    try:
        number = float(value)
    except ValueError:
        raise CompareInputError(f"{where}: {column} {value!r} is not a number") from None
    if required and not math.isfinite(number):
        raise CompareInputError(f"{where}: {column} is {value}")
    return number


def _int(value: str, where: str, column: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise CompareInputError(f"{where}: {column} {value!r} is not a whole number") from None
    if number < 0:
        raise CompareInputError(f"{where}: {column} {number} is negative")
    return number


def read_scan_csv(path: str | Path) -> pd.DataFrame:
    """Read a CSV written by ``--csv`` (or ``--format csv``), checking every row.

    Errors name the file and line: missing columns, short rows, non-numeric scores, duplicate heads.
    """
    source = Path(path)
    shown = display_path(source)
    if not source.exists():
        raise CompareInputError(f"{shown}: no such file", hint="check the path")
    if source.is_dir():
        raise CompareInputError(f"{shown}: is a directory, not a CSV file")
    raw = source.read_bytes()
    if b"\x00" in raw[:4096]:
        raise CompareInputError(
            f"{shown}: binary file, not a CSV", hint="give a CSV written by headscope --csv"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise CompareInputError(
            f"{shown}:{line}: not UTF-8 (byte 0x{raw[exc.start]:02x})", hint="save the file as UTF-8"
        ) from None
    if not text.strip():
        raise CompareInputError(f"{shown}: empty file", hint="give a CSV written by headscope --csv")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except csv.Error as exc:
        raise CompareInputError(f"{shown}:1: {exc}") from None
    header = [h.strip() for h in header]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise CompareInputError(
            f"{shown}:1: missing column(s) {', '.join(missing)}",
            hint="give a CSV written by headscope scan --csv",
        )
    index = {name: i for i, name in enumerate(header)}
    rows = []
    seen: dict[tuple, int] = {}
    try:
        for record in reader:
            line = reader.line_num
            if not record or all(not cell.strip() for cell in record):
                continue
            where = f"{shown}:{line}"
            if len(record) != len(header):
                raise CompareInputError(
                    f"{where}: {len(record)} fields, the header has {len(header)} (truncated or malformed row)"
                )

            def cell(name: str, record: list[str] = record) -> str:
                return record[index[name]].strip() if name in index else ""

            row = {
                "model": cell("model"),
                "detector": cell("detector"),
                "relation": cell("relation"),
                "direction": cell("direction"),
                "data": cell("data"),
                "layer": _int(cell("layer"), where, "layer"),
                "head": _int(cell("head"), where, "head"),
                "score": _float(cell("score"), where, "score", True),
                "ci_low": _float(cell("ci_low"), where, "ci_low", False),
                "ci_high": _float(cell("ci_high"), where, "ci_high", False),
                "role": cell("role"),
            }
            if not row["detector"]:
                raise CompareInputError(f"{where}: empty detector")
            key = tuple(row[k] for k in KEY)
            if key in seen:
                raise CompareInputError(f"{where}: the same head as line {seen[key]} ({_key_text(key)})")
            seen[key] = line
            rows.append(row)
    except csv.Error as exc:
        raise CompareInputError(f"{shown}:{reader.line_num}: {exc}") from None
    if not rows:
        raise CompareInputError(f"{shown}: a header but no rows")
    return pd.DataFrame(rows)


def _key_text(key: tuple) -> str:
    data, detector, relation, direction, layer, head = key
    parts = [p for p in (data, detector, relation, direction) if p]
    return f"{' '.join(parts)} L{layer}H{head}"


@dataclass
class TableChange:
    """One (data, detector, relation, direction) table across the two scans."""

    data: str
    detector: str
    relation: str
    direction: str
    best_a: tuple[int, int, float] | None  # (layer, head, score)
    best_b: tuple[int, int, float] | None
    n_common: int
    mean_delta: float
    correlation: float
    biggest_rise: tuple[int, int, float] | None  # (layer, head, delta)
    biggest_fall: tuple[int, int, float] | None
    gained: list[tuple[int, int]] = field(default_factory=list)
    lost: list[tuple[int, int]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return " · ".join(p for p in (self.data, self.detector, self.relation, self.direction) if p)


@dataclass
class Comparison:
    model_a: str
    model_b: str
    tables: list[TableChange]
    joined: pd.DataFrame
    only_a: int  # tables present in one scan only
    only_b: int
    notes: list[str] = field(default_factory=list)  # what was not compared, and why
    # Heads whose description changed (both results carry describe's atlas), largest change first.
    descriptions: list[dict[str, Any]] | None = None


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN under 3 pairs or for a constant side."""
    if len(a) < 3:
        return math.nan
    ranked_a, ranked_b = a.rank(method="average"), b.rank(method="average")
    if ranked_a.nunique() < 2 or ranked_b.nunique() < 2:
        return math.nan
    return float(ranked_a.corr(ranked_b))


def _layout(frame: pd.DataFrame) -> tuple[int, int]:
    """(layers, heads per layer) that a result's head numbers span."""
    return int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _table_names(keys: list[tuple]) -> str:
    names = [" · ".join(p for p in key if p) for key in keys]
    shown = ", ".join(names[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _best(frame: pd.DataFrame, column: str) -> tuple[int, int, float] | None:
    if frame.empty:
        return None
    row = frame.loc[frame[column].idxmax()]
    return int(row["layer"]), int(row["head"]), float(row[column])


def compare(a: pd.DataFrame, b: pd.DataFrame) -> Comparison:
    """Two results' tables side by side. Heads are paired by (layer, head): results of different
    layouts are refused, as are two that share no table (nothing would be compared)."""
    for side, frame in (("A", a), ("B", b)):
        if frame.empty:
            raise CompareInputError(f"compare: {side} has no head scores", hint="give a result with a table")
    layout_a, layout_b = _layout(a), _layout(b)
    if layout_a != layout_b:
        raise CompareInputError(
            f"compare: A has {_count(layout_a[0], 'layer')} x {_count(layout_a[1], 'head')}, B has "
            f"{_count(layout_b[0], 'layer')} x {_count(layout_b[1], 'head')}; heads are compared by layer "
            "and head number, which pairs unrelated heads across different layouts",
            hint="compare two results of one architecture (a model and its fine-tune, two checkpoints)",
        )
    tables_a = list(dict.fromkeys(map(tuple, a[TABLE].itertuples(index=False))))
    tables_b = list(dict.fromkeys(map(tuple, b[TABLE].itertuples(index=False))))
    only_in_a = [t for t in tables_a if t not in set(tables_b)]
    only_in_b = [t for t in tables_b if t not in set(tables_a)]
    if len(only_in_a) == len(tables_a):
        raise CompareInputError(
            f"compare: A and B share no table (A: {_table_names(tables_a)}; B: {_table_names(tables_b)})",
            hint="compare results of the same detectors on the same data",
        )
    notes = []
    if only_in_a:
        notes.append(f"only in A, not compared: {_table_names(only_in_a)}")
    if only_in_b:
        notes.append(f"only in B, not compared: {_table_names(only_in_b)}")
    joined = a.merge(b, on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    joined["delta"] = joined["score_b"] - joined["score_a"]
    role_a = joined["role_a"].fillna("")
    role_b = joined["role_b"].fillna("")
    joined["role_a"], joined["role_b"] = role_a, role_b
    joined["change"] = ""
    joined.loc[(role_a == "") & (role_b != ""), "change"] = "gained"
    joined.loc[(role_a != "") & (role_b == ""), "change"] = "lost"
    joined.loc[joined["_merge"] == "left_only", "change"] = "only in A"
    joined.loc[joined["_merge"] == "right_only", "change"] = "only in B"
    tables = []
    only_a = only_b = 0
    for key, group in joined.groupby(TABLE, sort=False):
        in_a = group[group["_merge"] != "right_only"]
        in_b = group[group["_merge"] != "left_only"]
        if in_b.empty:
            only_a += 1
        if in_a.empty:
            only_b += 1
        both = group[group["_merge"] == "both"]
        rise = fall = None
        if not both.empty:
            up = both.loc[both["delta"].idxmax()]
            down = both.loc[both["delta"].idxmin()]
            rise = (int(up["layer"]), int(up["head"]), float(up["delta"]))
            fall = (int(down["layer"]), int(down["head"]), float(down["delta"]))
        correlation = spearman(both["score_a"], both["score_b"])
        tables.append(
            TableChange(
                *key,
                best_a=_best(in_a, "score_a"),
                best_b=_best(in_b, "score_b"),
                n_common=len(both),
                mean_delta=float(both["delta"].mean()) if len(both) else math.nan,
                correlation=correlation,
                biggest_rise=rise,
                biggest_fall=fall,
                gained=[(int(r.layer), int(r.head)) for r in both[both["change"] == "gained"].itertuples()],
                lost=[(int(r.layer), int(r.head)) for r in both[both["change"] == "lost"].itertuples()],
            )
        )
    models_a = ", ".join(sorted(set(a["model"]))) or "A"
    models_b = ", ".join(sorted(set(b["model"]))) or "B"
    joined = joined.sort_values(KEY).reset_index(drop=True)
    return Comparison(models_a, models_b, tables, joined[JOINED_COLUMNS], only_a, only_b, notes)
