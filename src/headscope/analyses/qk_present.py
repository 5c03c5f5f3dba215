"""How ``qk`` shows itself: the terminal table of each head's sources, the causal check, the HTML section."""

from __future__ import annotations

import html
import math
from typing import Any

SHOWN = 3  # sources per side in the terminal
EXAMPLES = 8  # heads whose example query the HTML section draws


def _interval(item: dict[str, Any]) -> str:
    if item.get("ci_low") is None or item.get("ci_high") is None:
        return ""
    return f" [{item['ci_low']:.2f}, {item['ci_high']:.2f}]"


def source_text(item: dict[str, Any], interval: bool = True, side: str = "") -> str:
    """``L16H0 (previous-token) 0.71 [0.66, 0.77] K-comp 0.12``: the share with its interval, and
    (``side`` given) the weight-only composition score of a head source."""
    role = f" ({item['role']})" if item.get("role") else ""
    comp = item.get("composition")
    weights = f" {side[0].upper()}-comp {comp:.2f}" if side and comp is not None else ""
    share = "—" if item.get("share") is None else f"{item['share']:.2f}"
    return f"{item['source']}{role} {share}{_interval(item) if interval else ''}{weights}"


def reconstructed(entry: dict[str, Any], k: int) -> dict[str, Any] | None:
    return next((r for r in entry.get("reconstructed", []) if r["k"] == k), None)


# The terminal leads with the heads a researcher looks for: those with a role the detectors found,
# in this order, then the heads without one, then sink heads (their margin is their rest on the first
# token, explained mostly by an MLP's write there; SmolLM2 has dozens of them).
ROLE_ORDER = ("induction", "previous-token", "duplicate-token")


def ranked(heads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Heads grouped by role (:data:`ROLE_ORDER`, then other roles by name, then no role, then
    sink), each group by its top key source's share, largest first; layer 0 last within its group
    (its only sources are the embedding and biases), and the heads without shares (their margin not
    resolved) after those."""

    def group(entry: dict[str, Any]) -> tuple[int, str]:
        role = entry.get("role") or ""
        if role in ROLE_ORDER:
            return ROLE_ORDER.index(role), ""
        if role == "sink":
            return len(ROLE_ORDER) + 2, ""
        return (len(ROLE_ORDER), role) if role else (len(ROLE_ORDER) + 1, "")

    def top(entry: dict[str, Any]) -> float:
        share = entry["key"][0]["share"] if entry.get("key") else None
        return 0.0 if share is None else share

    return sorted(heads, key=lambda e: (group(e), bool(e.get("unresolved")), e["layer"] == 0, -top(e)))


def print_qk(result: Any, console: Any, top: int) -> None:
    """Per head (the ``top`` with the largest top key share), its top sources on each side."""
    from rich.markup import escape

    found = result.qk
    if found is None:
        return
    heads = ranked(found.heads)
    shown = heads[: max(top, 1)]
    console.print(
        f"[bold]Why each head attends where it does[/bold] ({escape(found.data)}, "
        f"{found.windows.get('eval', '?')} evaluation windows): each source's share of the head's "
        "margin (attention-weighted score minus the mean score over the visible keys); K-comp and "
        "Q-comp: the weight-only composition score of a head source. Heads by role (induction, "
        "previous-token, duplicate-token, others, none, sink), then by their top key share"
    )
    for entry in shown:
        role = f" ({entry['role']})" if entry.get("role") else ""
        console.print(f"\n[bold]L{entry['layer']}H{entry['head']}[/bold]{escape(role)}")
        if entry.get("unresolved"):
            console.print(f"  no shares: {escape(entry['unresolved'])}")
            continue
        for side, label in (("key", "keys from   "), ("query", "queries from")):
            items = " · ".join(escape(source_text(item, side=side)) for item in entry[side][:SHOWN])
            console.print(f"  {label} {items}")
        rebuilt = entry.get("reconstructed") or []
        if rebuilt:
            kept = " / ".join(f"{r['explained']:.2f}" for r in rebuilt if r["k"] > 0)
            ks = "/".join(str(r["k"]) for r in rebuilt if r["k"] > 0)
            floor = reconstructed(entry, 0)
            console.print(
                f"  top {ks} sources each side rebuild {kept} of its attention"
                + ("" if floor is None else f" (every source at its mean: {floor['explained']:.2f})")
            )
    if len(shown) < len(heads):
        console.print(f"\n{len(heads) - len(shown)} more heads in --csv and --format json (--top shows more)")
    check = found.check
    console.print(
        f"\ndecomposition check: the sources' parts sum to each head's margin to "
        f"{bound(check.get('score_error'))} relative (tolerance {check.get('score_tolerance', 1e-4):g}); "
        f"softmax of the module's own scores matches its attention to {bound(check.get('attention_error'))}"
    )


def bound(error: float | None) -> str:
    """An error as a bound ("< 1e-6", "≤ 1e-5"), not its round-off digits, which differ between machines."""
    if error is None:
        return "n/a"
    if error < 1e-6:
        return "< 1e-6"
    return f"≤ 1e{math.ceil(math.log10(error)):d}"


def print_removals(removals: Any, console: Any) -> None:
    from rich.table import Table

    table = Table(title="Causal check: the top key source removed from the head's key input only")
    for column in ("head", "source", "share", "attention moved", "random sources", "ratio [95% CI]"):
        table.add_column(column)
    for item in removals.heads:
        ci = "" if item.ci_low is None else f" [{item.ci_low:.1f}, {item.ci_high:.1f}]"
        table.add_row(
            f"L{item.layer}H{item.head}",
            item.source,
            f"{item.share:.2f}",
            f"{item.move:.3f}",
            f"{item.control_move:.3f} ({len(item.controls)})",
            "—" if item.ratio is None else f"{item.ratio:.1f}{ci}",
        )
    console.print(table)
    for item in removals.heads:
        if item.note:
            console.print(f"L{item.layer}H{item.head}: {item.note}", highlight=False)
    for line in removals.skipped:
        console.print(f"not verified: {line}", highlight=False)
    which = sorted({item.rows for item in removals.heads})
    if which:
        console.print(
            "attention moved: ½ Σ |A − A′| (total variation), averaged over " + "; ".join(which),
            highlight=False,
        )


def html_section(found: Any) -> str:
    """One table row per head with its key and query sources as bars."""
    rows = []
    for entry in ranked(found.heads):
        cells = []
        for side in ("key", "query"):
            bars = []
            if entry.get("unresolved"):
                cells.append(
                    f"<td>no shares: {html.escape(entry['unresolved'])}</td>"
                    if side == "key"
                    else "<td></td>"
                )
                continue
            for item in entry[side][:5]:
                width = max(0.0, min(1.0, abs(item["share"]))) * 100
                colour = "#3b7dd8" if item["share"] >= 0 else "#d8643b"
                bars.append(
                    f'<div class="qk-bar"><span class="qk-name">{html.escape(source_text(item, False))}</span>'
                    f'<span class="qk-fill" style="width:{width:.0f}px;background:{colour}"></span></div>'
                )
            cells.append(f"<td>{''.join(bars)}</td>")
        rebuilt = reconstructed(entry, 3)
        rows.append(
            f"<tr><td>L{entry['layer']}H{entry['head']}</td><td>{html.escape(entry.get('role', ''))}</td>"
            + "".join(cells)
            + f"<td>{'' if rebuilt is None else format(rebuilt['explained'], '.2f')}</td></tr>"
        )
    examples = "".join(
        example_html(entry) for entry in ranked(found.heads)[:EXAMPLES] if entry.get("example")
    )
    style = (
        "<style>.qk-bar{display:flex;gap:6px;align-items:center;font:12px monospace}"
        ".qk-fill{display:inline-block;height:8px}.qk-name{min-width:16em}"
        ".qk-example td,.qk-example th{font:12px monospace;padding:1px 6px;text-align:right}</style>"
    )
    return (
        style
        + f"<h2>Why each head attends where it does</h2><p>{html.escape(found.data)}: each source's share "
        "of the head's margin (attention-weighted score minus the mean score), evaluation windows.</p>"
        "<table><tr><th>head</th><th>role</th><th>keys from</th><th>queries from</th><th>top-3 rebuilds</th></tr>"
        + "".join(rows)
        + "</table>"
        + examples
    )


def example_html(entry: dict[str, Any]) -> str:
    """One query of the head: its most-attended keys, each key's score split by the head's top key
    sources (and the rest), beside the mean score over the visible keys."""
    example = entry["example"]
    keys = example["keys"]
    if not keys:
        return ""
    sources = list(keys[0]["parts"])
    head = "".join(f"<th>{html.escape(name)}</th>" for name in sources)
    body = []
    for key in keys:
        cells = "".join(f"<td>{key['parts'][name]:+.2f}</td>" for name in sources)
        body.append(
            f"<tr><td>{key['position']}</td><td>{html.escape(repr(key['token']))}</td>"
            f"<td>{key['attention']:.3f}</td><td>{key['score']:.2f}</td>{cells}<td>{key['rest']:+.2f}</td></tr>"
        )
    mean_text = f"; mean score over the visible keys {example['mean_score']:.2f}"
    return (
        f"<h3>L{entry['layer']}H{entry['head']}: query {example['query']} "
        f"{html.escape(repr(example['token']))} (margin {example['margin']:.2f}{mean_text})</h3>"
        "<table class='qk-example'><tr><th>key</th><th>token</th><th>attention</th><th>score</th>"
        f"{head}<th>rest</th></tr>{''.join(body)}</table>"
    )
