"""``headscope ioi`` for people: the per-prompt-set summary and head table, and the verification."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from headscope.extend.render import fmt, fmt_ci, heads_text

IOI_CAPTION = (
    "DLA: the head's direct logit attribution toward IO against S at the last token (nats, through "
    "the final norm at the actual residual); IO, S1+S2: its attention from the last token; S-inh: how much "
    "the name movers' attention to IO minus S drops when this head's output at the last token is "
    "patched in from the ABC run (path patching into their queries only); CI: 95% bootstrap over prompts"
)


def _head_rows(report: Any, data: str, relation: str, direction: str) -> pd.DataFrame:
    table = report.table
    rows = table[
        (table.data == data)
        & (table.detector == "ioi")
        & (table.relation == relation)
        & (table.direction == direction)
    ]
    return rows.set_index(["layer", "head"])


def ioi_table(report: Any, data: str, top: int) -> Table:
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
            fmt_ci(row.ci_low, row.ci_high, "–", brackets=False),
            fmt(float(attention["io"].loc[key].score)),
            fmt(to_s),
        ]
        if len(patch):
            effect = patch.loc[key]
            if key[0] < last_receiver:
                cells += [f"{effect.score:+.3f}", fmt_ci(effect.ci_low, effect.ci_high, "–", brackets=False)]
            else:  # not a sender: path patching only runs from layers before the last name mover
                cells += ["–", "–"]
        table.add_row(*cells)
    return table


def ioi_summary(outcome: Any) -> str:
    right = round(outcome.accuracy * outcome.n)
    return (
        f"IOI accuracy {right}/{outcome.n} = {fmt(outcome.accuracy)} {fmt_ci(*outcome.accuracy_ci)}; "
        f"mean logit difference IO − S {fmt(outcome.logit_diff)} {fmt_ci(*outcome.logit_diff_ci)} nats; "
        f"{outcome.single_token_names} of {outcome.names} names are one token"
    )


def print_ioi_sections(report: Any, section: Any, console: Console, top: int) -> None:
    """One prompt set's IOI tables as one block: accuracy, the heads, what the columns mean."""
    console.print(f"[bold]ioi · {section.data}[/bold]: {section.summary}")
    outcome = report.outcomes.get(section.data)
    if outcome is not None:
        console.print(ioi_summary(outcome))
    console.print(ioi_table(report, section.data, top))
    console.print(f"data: {section.description}; {IOI_CAPTION}")
    console.print()


def print_ioi_verification(check: Any, console: Console) -> None:
    k = len(check.heads)
    console.print(
        f"[bold]verify ({check.mode}) · {check.data}[/bold]: ablate the {k} name movers ({heads_text(check.heads)}) "
        f"vs {k} random same-layer heads ({len(check.random_heads)} draws)"
    )
    console.print(
        f"mean logit difference IO − S: clean {fmt(check.clean)}, name movers ablated {fmt(check.ablated)} "
        f"({check.ablated - check.clean:+.3f}), random heads ablated {fmt(check.random)} "
        f"({check.random - check.clean:+.3f})"
    )
