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
from headscope.analyses.ablation import AblationResult, LossEstimate
from headscope.detectors.syntax import RELATION_NAMES


def render_text(draw: Callable[[Console], None], width: int = 140) -> str:
    """What ``draw`` prints, as plain text (no colour codes), for writing tables to a file."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False, color_system=None)
    draw(console)
    return buffer.getvalue()


def jsonable(value: Any) -> Any:
    """NaN and infinities become null; tuples become lists; numpy scalars become numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-ready dicts (NaN becomes null)."""
    return json.loads(frame.to_json(orient="records", double_precision=10))


def _section_json(section: Section) -> dict[str, Any]:
    """A section's fields without its one-line summary; extras only where there are any."""
    fields = dataclasses.asdict(section)
    del fields["summary"]
    if not fields["extras"]:
        del fields["extras"]
    return fields


def layout_json(layout: Any) -> dict[str, Any]:
    """A HeadLayout as JSON (the result files and the HTML report)."""
    return {
        "layers": layout.n_layers,
        "heads": layout.n_heads,
        "kv_heads": layout.n_kv_heads,
        "group_size": layout.group_size,
        "head_dim": layout.head_dim,
        "d_model": layout.d_model,
        "local_layers": list(layout.local_layers),
        "window": layout.window,
    }


def report_json(report: Report, command: str, **extra: Any) -> dict[str, Any]:
    """The machine-readable form of a report: the CSV rows plus what the tables say around them."""
    from headscope import __version__
    from headscope.verdicts.results import CSV_COLUMNS

    out: dict[str, Any] = {
        # The format's name and version, checked when the file is read back (api.result.check_result).
        "schema": "headscope-result/1",
        "headscope": __version__,
        "command": command,
        "model": report.model,
        "capture": report.capture_mode,
        "sections": [_section_json(s) for s in report.sections],
        "rows": records(report.table[CSV_COLUMNS]),
        "notes": list(report.notes),
    }
    if report.layout is not None:
        out["layout"] = layout_json(report.layout)
    if report.layout is not None and report.layout.local_layers:
        out["layers"] = {
            "local": list(report.layout.local_layers),
            "global": list(report.layout.global_layers),
            "window": report.layout.window,
        }
    if report.loss is not None:
        out["copy_loss"] = {
            "per_copy": report.loss.per_copy,
            "tokens_per_copy": report.loss.tokens_per_copy,
            "first": report.loss.first,
            "later": report.loss.later,
        }
    if report.outcomes:
        out["outcomes"] = {data: outcome.to_json() for data, outcome in report.outcomes.items()}
    out.update({key: value for key, value in extra.items() if value is not None})
    return out


def roles_records(report: Report) -> list[dict[str, Any]]:
    from headscope.verdicts.roles import ROLES_CSV_COLUMNS, head_roles

    return records(head_roles(report.table)[ROLES_CSV_COLUMNS])


def table_csv(table: pd.DataFrame, columns: list[str] | None = None) -> str:
    from headscope.verdicts.results import CSV_COLUMNS

    return table[columns or CSV_COLUMNS].to_csv(index=False, float_format="%.6g", lineterminator="\n")


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def _fmt_ci(low: float, high: float, sep: str = ", ", brackets: bool = True) -> str:
    """An interval, or "n/a" where none could be computed (too few examples, or --resamples 0)."""
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (low, high)):
        return "n/a"
    text = f"{_fmt(low)}{sep}{_fmt(high)}"
    return f"[{text}]" if brackets else text


def section_title(section: Section) -> str:
    parts = [section.detector]
    if section.detector == "retrieval":
        parts.append(section.data)
    if section.relation:
        parts.append(section.relation)
    if section.direction:
        parts.append(section.direction)
    return " · ".join(parts)


def weights_caption(section: Section, outcome: Any = None) -> str:
    """What a weights table's score, baseline and interval mean."""
    if section.relation == "eigenvalue":
        return (
            f"data: {section.description}; score in [-1, 1], 0 for a random matrix; computed once on "
            "the sampled tokens' circuit (no interval, no role: the token tests decide)"
        )
    if section.relation == "successor":
        counts = ""
        if outcome is not None:
            parts = [
                f"{t.task} {t.qualified}/{t.total}"
                for t in outcome.tasks
                if t.data == section.data and t.pairs
            ]
            counts = "; single-token members: " + ", ".join(parts)
        return (
            f"data: {section.description}{counts}; n = {section.n} pairs; chance baseline = "
            f"{_fmt(section.baseline)} (1 / task size); CI: 95% bootstrap over pairs"
        )
    baseline = f"{section.baseline:.2e}" if section.baseline is not None else "–"
    return (
        f"data: {section.description}; n = {section.n} tokens; baseline = k / vocabulary = {baseline}; "
        "CI: 95% bootstrap over tokens"
    )


def section_caption(section: Section) -> str:
    if section.detector == "coref":
        return (
            f"data: {section.description}; n = {section.n} examples; nearest-candidate baseline = "
            f"{_fmt(section.baseline)}; chance = {_fmt(section.extras.get('chance'))}; "
            f"first-candidate = {_fmt(section.extras.get('first candidate'))}; "
            "CI: 95% bootstrap over examples"
        )
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


def syntax_summary_table(report: Report, sections: list[Section]) -> Table:
    """One row per relation and direction: the best head against the best positional baseline."""
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
    names = dict.fromkeys(s.relation for s in sections)
    return "; ".join(f"{r} = {RELATION_NAMES[r]}" for r in names if r in RELATION_NAMES)


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


IOI_CAPTION = (
    "DLA: the head's direct logit attribution toward IO against S at the last token (nats, through "
    "the final norm at the actual residual); IO, S1+S2: its attention from the last token; S-inh: how much "
    "the name movers' attention to IO minus S drops when this head's output at the last token is "
    "patched in from the ABC run (path patching into their queries only); CI: 95% bootstrap over prompts"
)


def _head_rows(report: Report, data: str, relation: str, direction: str) -> pd.DataFrame:
    table = report.table
    rows = table[
        (table.data == data)
        & (table.detector == "ioi")
        & (table.relation == relation)
        & (table.direction == direction)
    ]
    return rows.set_index(["layer", "head"])


def ioi_table(report: Report, data: str, top: int) -> Table:
    """Heads with an IOI role, then the largest |DLA|, with their attention and patching effect."""
    dla = _head_rows(report, data, "dla", "io-s")
    attention = {t: _head_rows(report, data, "attention", t) for t in ("io", "s1", "s2")}
    patch = _head_rows(report, data, "s-inhibition", "patch")
    roles = report.table[
        (report.table.data == data) & (report.table.detector == "ioi") & (report.table.role != "")
    ]
    chosen = list(dict.fromkeys((int(r.layer), int(r.head)) for r in roles.itertuples()))
    by_size = dla.assign(size=dla.score.abs()).sort_values("size", ascending=False)
    for key in by_size.index[: max(top, 0)]:
        if key not in chosen and len(chosen) < max(top, len(roles)):
            chosen.append((int(key[0]), int(key[1])))
    movers = roles[roles.role == "nm"]
    last_receiver = int(movers.layer.max()) if len(movers) else -1
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True)
    columns = ["head", "role", "DLA", "95% CI", "IO", "S1+S2"]
    if len(patch):
        columns += ["S-inh", "95% CI "]
    for name in columns:
        table.add_column(name, justify="left" if name in {"head", "role"} else "right", no_wrap=True)
    for key in sorted(chosen):
        row = dla.loc[key]
        role = ",".join(
            dict.fromkeys(r.role for r in roles.itertuples() if (int(r.layer), int(r.head)) == key)
        )
        to_s = float(attention["s1"].loc[key].score) + float(attention["s2"].loc[key].score)
        cells = [
            f"L{key[0]} H{key[1]}",
            role,
            f"{row.score:+.3f}",
            _fmt_ci(row.ci_low, row.ci_high, "–", brackets=False),
            _fmt(float(attention["io"].loc[key].score)),
            _fmt(to_s),
        ]
        if len(patch):
            effect = patch.loc[key]
            if key[0] < last_receiver:
                cells += [f"{effect.score:+.3f}", _fmt_ci(effect.ci_low, effect.ci_high, "–", brackets=False)]
            else:  # not a sender: path patching only runs from layers before the last name mover
                cells += ["–", "–"]
        table.add_row(*cells)
    return table


def ioi_summary(outcome: Any) -> str:
    right = round(outcome.accuracy * outcome.n)
    return (
        f"IOI accuracy {right}/{outcome.n} = {_fmt(outcome.accuracy)} {_fmt_ci(*outcome.accuracy_ci)}; "
        f"mean logit difference IO − S {_fmt(outcome.logit_diff)} {_fmt_ci(*outcome.logit_diff_ci)} nats; "
        f"{outcome.single_token_names} of {outcome.names} names are one token"
    )


def needle_table(outcome: Any) -> Table:
    """Needle accuracy by context length (rows) and depth (columns), like a NIAH heatmap."""
    contexts = list(dict.fromkeys(c["context"] for c in outcome.cells))
    depths = list(dict.fromkeys(c["depth"] for c in outcome.cells))
    cells = {(c["context"], c["depth"]): c for c in outcome.cells}
    table = Table()
    table.add_column("context (tokens)", justify="right")
    for depth in depths:
        table.add_column(f"depth {depth:g}", justify="right")
    for context in contexts:
        mean_tokens = sum(cells[(context, d)]["mean_tokens"] for d in depths) / len(depths)
        table.add_row(
            f"{context} (~{mean_tokens:.0f})",
            *(f"{cells[(context, d)]['correct']}/{cells[(context, d)]['n']}" for d in depths),
        )
    return table


def needle_summary(outcome: Any) -> str:
    right = sum(outcome.per_prompt)
    return (
        f"needle accuracy {right}/{outcome.n} = {_fmt(outcome.accuracy)} (every answer token top-1, "
        f"as greedy decoding would give it); answer loss {_fmt(outcome.answer_loss)} nats; "
        f"{outcome.counted} of {outcome.answer_tokens} answer tokens predicted right (the retrieval score's n)"
    )


def decided_by_whole_run(report: Report) -> bool:
    """Whether printing ``report`` (a finished part of a run) shows roles, which the whole run
    decides (one false-discovery correction over every table): the IOI tables do."""
    return any(section.detector == "ioi" for section in report.sections)


def print_report(report: Report, console: Console, top: int, start: int = 0) -> None:
    """The report's tables, from section ``start`` on (the ones before were printed as they finished)."""
    printed_syntax: set[str] = set()
    printed_ioi: set[str] = set()
    for section in report.sections[start:]:
        if section.detector == "ioi":
            if section.data in printed_ioi:
                continue
            printed_ioi.add(section.data)
            console.print(f"[bold]ioi · {section.data}[/bold]: {section.summary}")
            outcome = report.outcomes.get(section.data)
            if outcome is not None:
                console.print(ioi_summary(outcome))
            console.print(ioi_table(report, section.data, top))
            console.print(f"data: {section.description}; {IOI_CAPTION}")
            console.print()
            continue
        if section.detector == "syntax":
            if section.data in printed_syntax:
                continue
            printed_syntax.add(section.data)
            group = [s for s in report.sections if s.detector == "syntax" and s.data == section.data]
            console.print(f"[bold]syntax · {section.data}[/bold]: {section.summary}")
            console.print(syntax_summary_table(report, group))
            console.print(relation_legend(group))
            console.print(
                f"data: {section.description}; baseline: best positional rule (always the word k "
                "positions away, or always the first word); CI: 95% bootstrap over sentences"
            )
            console.print()
            continue
        # Heading and notes go on their own lines: a table title would wrap at the table's width.
        title = section_title(section)
        if section.detector == "coref":
            title = f"coreference · {section.data} · {RELATION_NAMES['coref']}"
        console.print(f"[bold]{title}[/bold]: {section.summary}")
        if section.detector == "retrieval" and section.data in report.outcomes:
            outcome = report.outcomes[section.data]
            console.print(needle_summary(outcome))
            console.print(needle_table(outcome))
        console.print(top_heads_table(report, section, top))
        if section.detector == "weights":
            console.print(weights_caption(section, report.outcomes.get("vocab")))
        else:
            console.print(section_caption(section))
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


def print_ablation(result: AblationResult, console: Console) -> None:
    """Clean vs top-K vs random-K later-copy loss, with intervals and effects."""
    console.print(
        f"[bold]ablation[/bold] ({result.mode}): loss on the repeated copies with heads removed; "
        f"random control = {len(result.random_draws)} draws of {result.k} heads from the same layers"
    )
    table = Table()
    for name, justify in [
        ("condition", "left"),
        ("heads", "left"),
        ("loss", "right"),
        ("95% CI", "center"),
        ("Δ vs clean", "right"),
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def heads_text(heads: list[tuple[int, int]]) -> str:
        return " ".join(f"L{layer}H{head}" for layer, head in heads)

    def row(name: str, heads: str, estimate: LossEstimate) -> None:
        delta = estimate.mean - result.clean.mean
        table.add_row(
            name,
            heads,
            _fmt(estimate.mean),
            _fmt_ci(estimate.ci[0], estimate.ci[1]),
            f"{delta:+.3f}",
        )

    row("clean", "–", result.clean)
    row(f"top-{result.k} induction", heads_text(result.topk_heads), result.topk)
    row(f"random-{result.k} (mean of draws)", "", result.random)
    for index, (heads, estimate) in enumerate(
        zip(result.random_heads, result.random_draws, strict=True), start=1
    ):
        row(f"  draw {index}", heads_text(heads), estimate)
    console.print(table)
    ratio = result.topk_effect / result.random_effect if result.random_effect > 1e-9 else float("inf")
    console.print(
        f"top-{result.k} ablation raises the repeated-copy loss by {result.topk_effect:+.3f} nats, "
        f"the random control by {result.random_effect:+.3f} ({ratio:.1f}x)"
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


def print_verification(checks: list, console: Console, k: int, mode: str) -> None:
    """Each table's top-k ablation next to its score, against a random same-layer control."""
    console.print(
        f"[bold]verification[/bold]: loss change when each table's top-{k} heads are ablated ({mode}), "
        f"against {k} random heads from the same layers"
    )
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("table", justify="left")
    for name in ("top heads", "score", "clean", "Δ top", "Δ random"):
        table.add_column(name, justify="right", no_wrap=name != "top heads")
    for check in checks:
        name = " ".join(
            part
            for part in (
                check.data,
                check.detector if check.detector != "syntax" else "",
                check.relation,
                check.direction,
            )
            if part and part != "coref"
        )
        table.add_row(
            name,
            " ".join(f"L{layer}H{head}" for layer, head in check.heads),
            _fmt(check.best_score),
            _fmt(check.clean),
            f"{check.topk_effect:+.3f}",
            f"{check.random_effect:+.3f}",
        )
    console.print(table)
    console.print(
        "loss (nats) measured on: repeated-token detectors, the later copies; sink, the natural text; "
        "syntax, the dependents' tokens; coref, the pronouns' tokens"
    )


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
        # Token-level detectors are named by the detector; syntax and coref also by language.
        if change.detector == "syntax":
            name = " ".join(p for p in (change.data, change.relation, change.direction) if p)
        elif change.detector == "coref":
            name = change.data or "coref"
        else:
            name = change.detector.replace("previous-", "prev-").replace("duplicate-", "dup-")
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


def comparison_json(result: Any) -> dict[str, Any]:
    """``headscope compare --format json``: both models, the per-table changes, every joined row."""
    return {
        "model_a": result.model_a,
        "model_b": result.model_b,
        "tables": [dataclasses.asdict(t) for t in result.tables],
        "notes": list(result.notes),
        "rows": records(result.joined),
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


def _ablation_runs(result: Any, columns: tuple[str, str], loss_of: Callable[[Any], float]) -> Table:
    """One row per run of an ablation check: clean, top-k heads ablated, each random draw."""
    table = Table()
    for name in ("run", "heads", *columns):
        table.add_column(name, justify="left" if name in {"run", "heads"} else "right")

    def heads_text(heads: list) -> str:
        return " ".join(f"L{layer}H{head}" for layer, head in heads)

    k = len(result.heads)
    table.add_row("clean", "–", _fmt(result.clean.accuracy), _fmt(loss_of(result.clean)))
    table.add_row(
        f"top-{k}", heads_text(result.heads), _fmt(result.ablated.accuracy), _fmt(loss_of(result.ablated))
    )
    for index, (heads, run) in enumerate(zip(result.random_heads, result.random, strict=True), start=1):
        table.add_row(f"random {index}", heads_text(heads), _fmt(run.accuracy), _fmt(loss_of(run)))
    return table


def print_retrieval_ablation(result: Any, console: Console) -> None:
    """Needle accuracy and answer loss: intact, top-K retrieval heads ablated, random same-layer heads."""
    k = len(result.heads)
    where = f" · {result.data}" if result.data else ""
    console.print(
        f"[bold]ablation ({result.mode}){where}[/bold]: top-{k} retrieval heads vs {k} random heads "
        f"from the same layers ({len(result.random)} draws)"
    )
    console.print(_ablation_runs(result, ("needle accuracy", "answer loss (nats)"), lambda o: o.answer_loss))
    mean_random = sum(r.accuracy for r in result.random) / len(result.random)
    console.print(
        f"needle accuracy {_fmt(result.clean.accuracy)} → {_fmt(result.ablated.accuracy)} with the top heads "
        f"ablated, → {_fmt(mean_random)} (mean) with random heads"
    )


def print_successor_ablation(result: Any, console: Console) -> None:
    """Next-ordinal accuracy and loss: intact, top-K successor heads ablated, random same-layer heads."""
    k = len(result.heads)
    console.print(
        f"[bold]successor ablation ({result.mode}) · {result.data}[/bold]: top-{k} successor heads vs {k} "
        f"random heads from the same layers ({len(result.random)} draws), on {result.clean.n} prompts of "
        'three consecutive members (e.g. "Monday, Tuesday, Wednesday," → " Thursday")'
    )
    console.print(_ablation_runs(result, ("next-member accuracy", "loss (nats)"), lambda o: o.loss))
    mean_acc = sum(r.accuracy for r in result.random) / len(result.random)
    mean_loss = sum(r.loss for r in result.random) / len(result.random)
    console.print(
        f"accuracy {_fmt(result.clean.accuracy)} → {_fmt(result.ablated.accuracy)} (top heads) vs "
        f"{_fmt(mean_acc)} (random, mean); loss {_fmt(result.clean.loss)} → {_fmt(result.ablated.loss)} vs "
        f"{_fmt(mean_loss)}"
    )


def print_ioi_verification(check: Any, console: Console) -> None:
    k = len(check.heads)
    heads = " ".join(f"L{layer}H{head}" for layer, head in check.heads)
    console.print(
        f"[bold]verify ({check.mode}) · {check.data}[/bold]: ablate the {k} name movers ({heads}) "
        f"vs {k} random same-layer heads ({len(check.random_heads)} draws)"
    )
    console.print(
        f"mean logit difference IO − S: clean {_fmt(check.clean)}, name movers ablated {_fmt(check.ablated)} "
        f"({check.ablated - check.clean:+.3f}), random heads ablated {_fmt(check.random)} "
        f"({check.random - check.clean:+.3f})"
    )


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


def _est(estimate: Any, digits: int = 3) -> str:
    low, high = estimate.ci
    return f"{_fmt(estimate.mean, digits)} {_fmt_ci(low, high)}"


def print_icl(measures: Any, console: Console) -> None:
    """headscope icl: the ICL score, few-shot accuracy by shots, and the function vector's transfer."""
    score = measures.score
    if score is not None:
        console.print(
            f"[bold]ICL score[/bold] (loss at token {score.late} − loss at token {score.early}, "
            f"each ±{score.window} tokens, over {score.score.n} texts): {_est(score.score)}"
        )
        # Each position averaged over ±window tokens, as the score's two ends are: the cells at the
        # early and late tokens differ by exactly the score (single tokens are noisy).
        w = score.window
        marks = {2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, score.early, score.late}
        shown = sorted(p for p in marks if w < p <= len(score.curve) - w)
        cells = " · ".join(f"{p}: {_fmt(sum(score.curve[p - 1 - w : p + w]) / (2 * w + 1))}" for p in shown)
        console.print(f"mean loss by token (±{w} tokens): {cells}", soft_wrap=True)
    if measures.accuracy:
        shots = sorted({a.shots for a in measures.accuracy})
        table = Table(title="few-shot accuracy (top-1 answer token, 95% CI over queries)")
        table.add_column("task", justify="left")
        for n in shots:
            table.add_column(f"{n}-shot", justify="right")
        tasks = list(dict.fromkeys(a.task for a in measures.accuracy))
        by = {(a.task, a.shots): a.accuracy for a in measures.accuracy}
        for task in tasks:
            table.add_row(task, *(_est(by[(task, n)], 2) if (task, n) in by else "–" for n in shots))
        console.print(table)
    transfer = measures.transfer
    if transfer is not None:
        heads = " ".join(f"L{layer}H{head}" for layer, head in transfer.heads)
        console.print(
            f"[bold]function vector[/bold] (top-{transfer.k} FV heads: {heads}; tasks {', '.join(measures.fv_tasks)}), "
            f"added after layer {transfer.layer} (best of the layer sweep on half the queries), "
            f"zero-shot accuracy on the other half: none {_est(transfer.zero_shot, 2)}, "
            f"function vector {_est(transfer.function_vector, 2)}, "
            f"{transfer.k} random same-layer heads {_est(transfer.random_vector, 2)} "
            f"({len(transfer.random_draws)} draws)",
            soft_wrap=True,
        )
        sweep = " ".join(f"{layer}:{acc:.2f}" for layer, acc in transfer.sweep)
        console.print(f"layer sweep (layer: accuracy on the selection half): {sweep}", soft_wrap=True)


def print_icl_ablation(check: Any, console: Console) -> None:
    """Yin and Steinhardt's comparison: the 2 × 3 table."""

    def heads_text(heads: list[tuple[int, int]]) -> str:
        return " ".join(f"L{layer}H{head}" for layer, head in heads) or "–"

    console.print(
        f"[bold]which heads matter for which ICL[/bold] ({check.mode} ablation of K={check.k} heads; "
        f"induction: {heads_text(check.heads['induction'])}; FV: {heads_text(check.heads['fv'])}; "
        f"top-K in both, left out: {heads_text(check.excluded)}; random: {len(check.random_heads)} draws "
        "from the same layers)",
        soft_wrap=True,
    )
    table = Table()
    table.add_column("measure", justify="left")
    table.add_column("clean", justify="right")
    for name in ("induction", "fv", "random"):
        table.add_column(f"{name} ablated (Δ)", justify="right")
    labels = {"icl_score": "ICL score (nats)", "accuracy": f"{check.shots}-shot accuracy"}
    for measure, label in labels.items():
        row = check.cells[measure]
        table.add_row(
            label,
            _est(check.clean[measure]),
            *(f"{_est(row[n].value)} ({_est(row[n].change)})" for n in ("induction", "fv", "random")),
        )
    console.print(table)


# --- a whole result, with its causal checks ------------------------------------------------------------


def _print_kv_plan(plan: Any, console: Console, top: int = 10) -> None:
    from headscope.outputs.kvplan import print_kv_plan

    print_kv_plan(plan, console, top)


def check_printers() -> dict[type, Callable[..., None]]:
    """One printer per type of check value (what an analysis' ``verify`` records): chosen by type,
    so a new check is its record type and its printer here, with no name to keep in step. Table
    checks (``Verification``) print together as one table, in :func:`print_checks`."""
    from headscope.analyses.ablation import AblationResult
    from headscope.analyses.icl import ICLAblation, ICLMeasures
    from headscope.analyses.ioi import IOIVerification
    from headscope.analyses.kvplan import KVPlan
    from headscope.analyses.retrieval import RetrievalAblation
    from headscope.analyses.weights import SuccessorAblation

    return {
        AblationResult: print_ablation,
        RetrievalAblation: print_retrieval_ablation,
        SuccessorAblation: print_successor_ablation,
        IOIVerification: print_ioi_verification,
        KVPlan: _print_kv_plan,
        ICLMeasures: print_icl,
        ICLAblation: print_icl_ablation,
    }


def print_checks(
    checks: list[Any], console: Console, *, verified: bool, k: int | None, spaced: bool, top: int = 10
) -> None:
    """The causal checks: every table check in one table, then each other check by its type's printer
    (``top`` rows where the printer lists heads: kv-plan's KV heads). A check of a type with no
    printer (a plugin's) prints its JSON."""
    from headscope.analyses.ablation import Verification

    tables = [c.value for c in checks if isinstance(c.value, Verification)]
    if tables or verified:
        k = k or max((len(t.heads) for t in tables), default=0)
        print_verification(tables, console, k, "zero")
        console.print()
    printers = check_printers()
    for check in checks:
        if isinstance(check.value, Verification):
            continue
        printer = next((p for kind, p in printers.items() if isinstance(check.value, kind)), None)
        if printer is _print_kv_plan:
            _print_kv_plan(check.value, console, top)
        elif printer is not None:
            printer(check.value, console)
        else:
            import json

            console.print(json.dumps(check.to_json(), indent=2, default=str), markup=False, highlight=False)
        if spaced:
            console.print()


def print_result(result: Any, console: Console, top: int, start: int = 0) -> None:
    """A ``headscope.Result`` for people: its tables (from section ``start`` on), its checks, and
    (scan) the role map."""
    from headscope.analyses.protocol import get

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
