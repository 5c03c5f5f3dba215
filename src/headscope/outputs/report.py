"""Rendering: Rich tables for people, CSV for spreadsheets (written by :mod:`headscope.files`)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from collections.abc import Callable
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from headscope.analyses import Report, Section
from headscope.extend.render import fmt as _fmt
from headscope.extend.render import fmt_ci as _fmt_ci

# The result document is written by its schema module; these names stay importable from here.
from .schema import jsonable, layout_json, records, report_json, roles_records  # noqa: F401


def render_text(draw: Callable[[Console], None], width: int = 140) -> str:
    """What ``draw`` prints, as plain text (no colour codes), for writing tables to a file."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False, color_system=None)
    draw(console)
    return buffer.getvalue()


def table_csv(table: pd.DataFrame, columns: list[str] | None = None) -> str:
    from headscope.verdicts.results import CSV_COLUMNS

    return table[columns or CSV_COLUMNS].to_csv(index=False, float_format="%.6g", lineterminator="\n")


class _Shown(dict):
    """A table's numbers as the tables print them; a name it does not hold shows as "–"."""

    def __missing__(self, key: str) -> str:
        return _fmt(None)


def _declared(section: Section) -> Any:
    """The declaration of a table's detector (how its tables print), or None."""
    from headscope import detectors

    return detectors.declared(section.detector)


def _spelled(template: str, section: Section) -> str:
    """``template`` (a detector's heading, caption or short name) filled with the table's fields."""
    found = _declared(section)
    names = getattr(found, "relation_names", {})
    return template.format(
        detector=section.detector,
        data=section.data,
        relation=section.relation,
        direction=section.direction,
        relation_name=names.get(section.relation, section.relation),
        description=section.description,
        n=section.n,
        n_examples=section.n_examples,
        baseline=_fmt(section.baseline),
        extras=_Shown({name: _fmt(value) for name, value in section.extras.items()}),
    )


def section_title(section: Section) -> str:
    """A table's heading: its detector's ``heading``, else "detector · relation · direction"."""
    heading = getattr(_declared(section), "heading", None)
    if heading is not None:
        return _spelled(heading, section)
    return " · ".join(p for p in (section.detector, section.relation, section.direction) if p)


def section_caption(section: Section, outcomes: dict[str, Any] | None = None) -> str:
    """The line under a table: an outcome's own ``caption(section)`` (the weights analysis' tables),
    its detector's ``caption``, else the data, n, baseline and interval."""
    for outcome in (outcomes or {}).values():
        own = outcome.caption(section) if hasattr(outcome, "caption") else None
        if own is not None:
            return str(own)
    caption = getattr(_declared(section), "caption", None)
    if caption is not None:
        return _spelled(caption, section)
    baseline = _fmt(section.baseline)
    low, high = section.baseline_range or (section.baseline, section.baseline)
    if low is not None and high is not None and high - low > 5e-4:
        baseline = f"{_fmt(low)}–{_fmt(high)} by layer (each layer's mask)"
    return (
        f"data: {section.description}; n = {section.n} positions in {section.n_examples} examples; "
        f"{section.baseline_kind}-attention baseline = {baseline}; "
        "CI: 95% bootstrap over examples"
    )


def _rows(report: Report, section: Section) -> pd.DataFrame:
    table = report.table
    return table[
        (table.data == section.data)
        & (table.detector == section.detector)
        & (table.relation == section.relation)
        & (table.direction == section.direction)
    ].sort_values("rank")


def grouped_table(report: Report, sections: list[Section]) -> Table:
    """A grouped detector's tables of one data set (syntax's): one row per relation and direction,
    the best head against the table's baseline."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    for name, justify in [
        ("relation", "left"),
        ("direction", "left"),
        ("n", "right"),
        ("head", "right"),
        ("acc", "right"),
        ("95% CI", "center"),
        ("baseline", "right"),
        ("margin", "right"),
    ]:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for section in sections:
        best = _rows(report, section).iloc[0]
        baseline = section.baseline or 0.0
        table.add_row(
            section.relation,
            section.direction,
            str(section.n),
            f"L{best['layer']} H{best['head']}",
            _fmt(best["score"]),
            _fmt_ci(best["ci_low"], best["ci_high"], "–", brackets=False),
            f"{_fmt(section.baseline)} ({section.baseline_label.removeprefix('offset ').replace('first word', 'first')})",
            f"{best['score'] - baseline:+.3f}",
        )
    return table


def relation_legend(sections: list[Section]) -> str:
    """What the relations of a grouped table mean (its detector's ``relation_names``)."""
    meanings = getattr(_declared(sections[0]), "relation_names", {}) if sections else {}
    names = dict.fromkeys(s.relation for s in sections)
    return "; ".join(f"{r} = {meanings[r]}" for r in names if r in meanings)


def top_heads_table(report: Report, section: Section, top: int) -> Table:
    rows = _rows(report, section)
    table = Table()
    for name, justify in [
        ("rank", "right"),
        ("layer", "right"),
        ("head", "right"),
        ("kv group", "right"),
        ("score", "right"),
        ("95% CI", "center"),
        ("n", "right"),
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows.head(top).itertuples():
        table.add_row(
            str(row.rank),
            str(row.layer),
            str(row.head),
            str(row.kv_group),
            _fmt(row.score),
            _fmt_ci(row.ci_low, row.ci_high),
            str(row.n),
        )
    return table


def decided_by_whole_run(report: Report) -> bool:
    """Whether printing ``report`` (a finished part of a run) shows roles, which the whole run
    decides (one false-discovery correction over every table): the tables an outcome prints as one
    block (IOI's) do."""
    return any(hasattr(outcome, "print_block") for outcome in report.outcomes.values())


def print_report(report: Report, console: Console, top: int, start: int = 0) -> None:
    """The report's tables, from section ``start`` on (the ones before were printed as they finished)."""
    printed_groups: set[tuple[str, str]] = set()
    printed_blocks: set[str] = set()
    for section in report.sections[start:]:
        # What an analysis measured beside its tables (report.outcomes, by data) prints itself:
        # ``print_block`` prints all of its data's tables as one block (IOI), ``print_to`` goes
        # between a table's heading and the table (the needle grid), and any outcome's
        # ``caption(section)`` may write the line under a table (the weights tables'). The rest is
        # read from the table's detector declaration (heading, caption, grouped, relation_names).
        outcome = report.outcomes.get(section.data)
        if hasattr(outcome, "print_block"):
            if section.data not in printed_blocks:
                printed_blocks.add(section.data)
                outcome.print_block(report, section, console, top)
            continue
        if getattr(_declared(section), "grouped", False):
            key = (section.detector, section.data)
            if key in printed_groups:
                continue
            printed_groups.add(key)
            group = [s for s in report.sections if (s.detector, s.data) == key]
            console.print(f"[bold]{section_title(section)}[/bold]: {section.summary}")
            console.print(grouped_table(report, group))
            console.print(relation_legend(group))
            console.print(section_caption(section, report.outcomes))
            console.print()
            continue
        # Heading and notes go on their own lines: a table title would wrap at the table's width.
        console.print(f"[bold]{section_title(section)}[/bold]: {section.summary}")
        if hasattr(outcome, "print_to"):
            outcome.print_to(console, top)
        console.print(top_heads_table(report, section, top))
        console.print(section_caption(section, report.outcomes))
        console.print()
    if report.loss is not None:
        loss = report.loss
        console.print("[bold]next-token loss by copy[/bold]: in-context copying of the repeated sequence")
        table = Table()
        table.add_column("copy", justify="right")
        table.add_column("mean loss (nats)", justify="right")
        table.add_column("tokens", justify="right")
        for index, (value, tokens) in enumerate(
            zip(loss.per_copy, loss.tokens_per_copy, strict=True), start=1
        ):
            table.add_row(str(index), _fmt(value), str(tokens))
        console.print(table)
        ratio = loss.first / loss.later if loss.later > 0 else float("inf")
        console.print(
            f"first copy {_fmt(loss.first)} vs later copies {_fmt(loss.later)} nats "
            f"({ratio:.1f}x lower once the sequence has been seen)"
        )


def print_role_map(
    report: Report, console: Console, rule_text: str, fill: dict[str, Any] | None = None
) -> None:
    """Layers × heads grid, each head labelled with its strongest role, then a legend."""
    from headscope.verdicts.roles import RESTING_ROLE, head_roles, spec_for_label

    heads = head_roles(report.table)
    n_layers = int(heads.layer.max()) + 1
    n_heads = int(heads["head"].max()) + 1
    grid = {(int(r.layer), int(r.head)): r.role for r in heads.itertuples()}
    specs = {label: spec_for_label(label) for label in set(grid.values()) if label}
    # Heads without a working role, filled in by an analysis (scan's descriptions): their labels
    # (a template's, marked "~", or sink), what those mean, and one more line for the counts.
    fill = fill or {}
    templates = {k: v for k, v in fill.get("labels", {}).items() if v.startswith("~")}
    for key, label in fill.get("labels", {}).items():
        grid[key] = label
        if not label.startswith("~"):
            specs.setdefault(label, spec_for_label(label))
    console.print(f"[bold]role map[/bold]: {report.model}, strongest role per head (blank: none)")
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("layer", justify="right")
    for head in range(n_heads):
        table.add_column(f"H{head}", justify="center")
    layout = report.layout
    marked = layout is not None and bool(layout.local_layers)
    for layer in range(n_layers):
        cells = []
        for head in range(n_heads):
            role = grid.get((layer, head), "")
            style = "italic dim" if role in fill.get("meanings", {}) else (specs[role].style if role else "")
            cells.append(f"[{style}]{escape(role)}[/{style}]" if role else "·")
        is_global = marked and layer in layout.global_layers  # type: ignore[union-attr]
        table.add_row(f"L{layer}{' G' if is_global else ''}", *cells)
    console.print(table)
    if marked:
        console.print(
            f"G: global attention layer; the others attend within a sliding window of {layout.window} tokens"  # type: ignore[union-attr]
        )
    used = sorted({r for r in grid.values() if r and not r.startswith("~")})
    legend = "; ".join(f"{label} = {specs[label].meaning}" for label in used)
    meanings = fill.get("meanings", {})
    if meanings:
        legend += "; " + "; ".join(f"{label} = {meanings[label]}" for label in sorted(meanings))
    working = heads[(heads.role != "") & (heads.role != RESTING_ROLE)]
    counts = working.role.value_counts()
    sinks = (
        sum(1 for r in grid.values() if r == RESTING_ROLE)
        if fill
        else int((heads.role == RESTING_ROLE).sum())
    )
    none_left = len(heads) - len(working) - sinks - len(templates)
    console.print(f"legend: {legend}" if legend else "no head qualifies for any role")
    console.print(
        f"{len(working)} of {len(heads)} heads have a role "
        f"({', '.join(f'{k} {v}' for k, v in counts.items()) or 'none'}); {sinks} more only park their "
        f"attention on the first token (sink, dimmed: the resting state); "
        + (f"{len(templates)} are described by a template; " if fill else "")
        + f"{none_left} have none; {rule_text}"
    )
    if fill.get("line"):
        console.print(fill["line"])


def table_name(table: Any) -> str:
    """A table's short name in ``headscope compare`` (``table`` has detector, relation, direction and
    data): its detector's ``short_name`` (syntax and coref name their language), else the detector's
    name, shortened."""
    from headscope import detectors

    template = getattr(detectors.declared(table.detector), "short_name", None)
    if template is not None:
        fields = {key: getattr(table, key) or "" for key in ("detector", "data", "relation", "direction")}
        name = " ".join(template.format(**fields).split())
        if name:
            return name
        return table.detector
    return table.detector.replace("previous-", "prev-").replace("duplicate-", "dup-")


def print_comparison(result: Any, console: Console) -> None:
    """Per table: the best head on each side, how shared heads moved, and roles gained or lost."""
    console.print(f"[bold]compare[/bold]: A = {result.model_a}, B = {result.model_b}")
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for name, justify in [
        ("table", "left"),
        ("best A", "right"),
        ("best B", "right"),
        ("mean Δ", "right"),
        ("r", "right"),
        ("largest Δ", "right"),
        ("roles", "left"),
    ]:
        wrap = name in {"table", "roles"}
        table.add_column(name, justify=justify, no_wrap=not wrap, overflow="fold")  # type: ignore[arg-type]

    def head(entry: tuple[int, int, float] | None, signed: bool = False) -> str:
        if entry is None:
            return "–"
        layer, h, value = entry
        return f"L{layer}H{h} {value:+.3f}" if signed else f"L{layer}H{h} {value:.3f}"

    shared = set()
    for change in result.tables:
        shared.add(change.n_common)
        moves = [m for m in (change.biggest_rise, change.biggest_fall) if m is not None]
        largest = max(moves, key=lambda m: abs(m[2])) if moves else None
        roles = " ".join(
            [
                *(f"+L{layer}H{h}" for layer, h in change.gained),
                *(f"−L{layer}H{h}" for layer, h in change.lost),
            ]
        )
        name = table_name(change)
        table.add_row(
            name,
            head(change.best_a),
            head(change.best_b),
            "–" if math.isnan(change.mean_delta) else f"{change.mean_delta:+.3f}",
            _fmt(change.correlation, 2),
            head(largest, signed=True),
            roles or "·",
        )
    console.print(table)
    gained = sum(len(c.gained) for c in result.tables)
    lost = sum(len(c.lost) for c in result.tables)
    heads = f"the {shared.pop()} heads" if len(shared) == 1 else "the heads"
    console.print(
        f"Δ = score in B − score in A, over {heads} present in both (same layer and head); r = Spearman "
        f"rank correlation of their scores; roles: +head = role appeared in B ({gained}), −head = "
        f"role disappeared ({lost})"
    )
    for note in result.notes:  # the tables found in one result only, by name
        console.print(f"note: {note}")
    if result.descriptions is not None:
        console.print(
            f"{len(result.descriptions)} heads changed their description (another dominant template, or "
            "mixtures at least 0.25 apart in total variation)"
        )
        for row in result.descriptions:
            console.print(
                f"L{row['layer']}H{row['head']}: {row['dominant_a']} -> {row['dominant_b']} "
                f"(distance {row['distance']:.2f}; explained {row['explained_a']:.2f} -> {row['explained_b']:.2f})",
                markup=False,
                highlight=False,
            )


def comparison_json(result: Any) -> dict[str, Any]:
    """``headscope compare --format json``: both models, the per-table changes, every joined row."""
    return {
        "model_a": result.model_a,
        "model_b": result.model_b,
        "tables": [dataclasses.asdict(t) for t in result.tables],
        "notes": list(result.notes),
        "rows": records(result.joined),
        "descriptions": result.descriptions,
    }


def check_text(found: dict[str, Any]) -> str:
    """One decomposition check as text: "ok (max relative error 3.1e-07)" or "refused: reason"."""
    if found["ok"]:
        return f"ok (max relative error {found['error']:.1e})"
    return f"refused: {found['reason']}"


def print_info(info: dict[str, Any], console: Console) -> None:
    """The attention layout of one model."""
    table = Table(box=box.SIMPLE_HEAD, show_header=False, padding=(0, 1), pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    groups = info["kv_groups"]
    if info["heads_per_kv_group"] == 1:
        grouping = "one KV head per query head"
    else:
        shown = [f"KV{i}: q{g[0]}–q{g[-1]}" for i, g in enumerate(groups)]
        grouping = ", ".join(shown)
    context = info["context"]
    rows = [
        ("model", info["model"]),
        ("source", info["source"]),
        ("architecture", f"{info['architecture']} ({'causal' if info['causal'] else 'bidirectional'})"),
        ("layers", str(info["layers"])),
        ("attention", info["attention"]),
        ("layer kinds", info["layer_attention"]["summary"]),
        ("query heads", f"{info['query_heads']} per layer ({info['layers'] * info['query_heads']} in all)"),
        (
            "KV heads",
            f"{info['kv_heads']} per layer, "
            + (
                "one per query head"
                if info["heads_per_kv_group"] == 1
                else f"each shared by {info['heads_per_kv_group']} query heads"
            ),
        ),
        ("KV grouping", grouping),
        ("head dim", str(info["head_dim"])),
        (
            "model dim",
            f"{info['d_model']} (= {info['query_heads']} × {info['head_dim']})"
            if info["query_heads"] * info["head_dim"] == info["d_model"]
            else str(info["d_model"]),
        ),
        ("context", "–" if context is None else f"{context:,} tokens"),
        ("parameters", f"{info['parameters']:,}"),
        ("vocabulary", "–" if info["vocab_size"] is None else f"{info['vocab_size']:,}"),
        ("attention fn", f"{info['attn_implementation']} (headscope capture: {info['capture']})"),
        *((f"check: {view}", check_text(found)) for view, found in info.get("checks", {}).items()),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def dataframe_table(frame: pd.DataFrame, digits: int = 3) -> Table:
    """A plain Rich table of a small DataFrame (sweep summaries)."""
    table = Table()
    for column in frame.columns:
        table.add_column(str(column), justify="right" if frame[column].dtype.kind in "fiu" else "left")
    for row in frame.itertuples(index=False):
        cells = []
        for value in row:
            if isinstance(value, float):
                cells.append(_fmt(value, digits))
            elif value is None:
                cells.append("–")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    return table


# --- a whole result, with its causal checks ------------------------------------------------------------


def print_checks(
    checks: list[Any], console: Console, *, verified: bool, k: int | None, spaced: bool, top: int = 10
) -> None:
    """The causal checks, each printed by its own value (what an analysis' ``verify`` records):

    * a value whose type has ``print_group(values, console, k)`` prints with the others of its type
      as one block, first (the table checks: one table); a run that verified prints that block even
      when no table qualified;
    * a value with ``print_to(console, top)`` prints itself (``top``: rows where it lists heads);
    * any other value (a plugin's plain record) prints its JSON.
    """
    from headscope.extend.ablation import Verification

    groups: dict[type, list[Any]] = {}
    for check in checks:
        if hasattr(type(check.value), "print_group"):
            groups.setdefault(type(check.value), []).append(check.value)
    if verified and not groups:
        groups[Verification] = []
    for kind, values in groups.items():
        kind.print_group(values, console, k or max((len(v.heads) for v in values), default=0))
        console.print()
    for check in checks:
        if type(check.value) in groups:
            continue
        if hasattr(check.value, "print_to"):
            check.value.print_to(console, top)
        else:
            console.print(json.dumps(check.to_json(), indent=2, default=str), markup=False, highlight=False)
        if spaced:
            console.print()


def print_result(result: Any, console: Console, top: int, start: int = 0) -> None:
    """A ``headscope.Result`` for people: its tables (from section ``start`` on), its checks, and
    (scan) the role map."""
    from headscope.analyses import get

    analysis = get(result.analysis)
    state = result.state
    if analysis.print_sections:
        print_report(result.report, console, top, start)
    print_checks(
        result.checks,
        console,
        verified=bool(state.get("verified")),
        k=state.get("k"),
        spaced=analysis.spaced_checks,
        top=top,
    )
    if analysis.json_roles and "rule" in state:
        print_role_map(result.report, console, state["rule"].describe(), state.get("role_map_fill"))
    analysis.present(result, console, top)
