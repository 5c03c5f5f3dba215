"""Generic rendering helpers for the terminal: numbers, intervals, head lists and small tables.

They sit at the analyses layer so that each analysis' own printers (beside its code) and the
generic report in :mod:`headscope.outputs` share them; nothing here knows any analysis.
"""

from __future__ import annotations

import html as _html
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from rich.table import Table


def fmt(value: float | None, digits: int = 3) -> str:
    """A number with ``digits`` decimals; "–" for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def fmt_ci(low: float, high: float, sep: str = ", ", brackets: bool = True) -> str:
    """An interval, or "n/a" where none could be computed (too few examples, or --resamples 0)."""
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high)):
        return "n/a"
    text = f"{fmt(low)}{sep}{fmt(high)}"
    return f"[{text}]" if brackets else text


def est(estimate: Any, digits: int = 3) -> str:
    """An estimate with ``mean`` and ``ci``: "0.512 [0.401, 0.620]"."""
    low, high = estimate.ci
    return f"{fmt(estimate.mean, digits)} {fmt_ci(low, high)}"


def heads_text(heads: Iterable[tuple[int, int]], empty: str = "") -> str:
    """(layer, head) pairs as "L0H1 L2H3"; ``empty`` where there are none."""
    return " ".join(f"L{layer}H{head}" for layer, head in heads) or empty


def ablation_runs(result: Any, columns: tuple[str, str], loss_of: Callable[[Any], float]) -> Table:
    """One row per run of an ablation check (``clean``, ``ablated``, ``random``, ``heads``,
    ``random_heads``): clean, top-k heads ablated, each random draw."""
    table = Table()
    for name in ("run", "heads", *columns):
        table.add_column(name, justify="left" if name in {"run", "heads"} else "right")
    k = len(result.heads)
    table.add_row("clean", "–", fmt(result.clean.accuracy), fmt(loss_of(result.clean)))
    table.add_row(
        f"top-{k}", heads_text(result.heads), fmt(result.ablated.accuracy), fmt(loss_of(result.ablated))
    )
    for index, (heads, run) in enumerate(zip(result.random_heads, result.random, strict=True), start=1):
        table.add_row(f"random {index}", heads_text(heads), fmt(run.accuracy), fmt(loss_of(run)))
    return table


# --- HTML fragments (an analysis' section of the HTML report) -------------------------------------------

NUM_OR_NULL = (int, float, type(None))


def html_text(value: Any) -> str:
    """``value`` as HTML text (or an attribute value): escaped, with no URL scheme left to follow."""
    return re.sub(r"(?i)(https?):", r"\1&#58;", _html.escape(str(value), quote=True))


def html_number(value: float | None, digits: int = 3, sign: str = "") -> str:
    """A number for an HTML cell; an em dash for None."""
    return "\u2014" if value is None else f"{value:{sign}.{digits}f}"


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _want(types: tuple[type, ...]) -> str:
    names = ["null" if t is type(None) else ("number" if t is float else t.__name__) for t in types]
    if "number" in names and "int" in names:
        names.remove("int")
    return " or ".join(dict.fromkeys(names))


def check_value(where: str, value: Any, types: tuple[type, ...]) -> None:
    """ValueError naming ``where`` unless ``value`` has one of ``types`` (a bool is no int)."""
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        raise ValueError(f"{where}: expected {_want(types)}, got {_type_name(value)} ({value!r:.60})")


def check_fields(where: str, obj: Any, spec: dict[str, tuple[type, ...]]) -> None:
    """ValueError naming the first key of ``spec`` that ``obj`` (a dict) lacks or holds wrongly typed."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {_type_name(obj)}")
    for key, types in spec.items():
        if key not in obj:
            raise ValueError(f"{where}: missing key {key!r}")
        check_value(f"{where}[{key!r}]", obj[key], types)


def check_list(where: str, items: Any, item_type: tuple[type, ...]) -> None:
    for i, item in enumerate(items):
        check_value(f"{where}[{i}]", item, item_type)
