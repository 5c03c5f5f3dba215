"""How ``graph`` shows itself in the terminal: the strongest edges of each role group, side by side
("induction heads ← keys from L0H1 (previous-token) 0.72 in 4 of 4 heads")."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .qk_present import ROLE_ORDER

SHOWN = 3  # sources per (group, side)
LABELS = {"query": "queries from", "key": "keys from   ", "value": "values from "}


def _groups(heads: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Heads by role: the roles the detectors lead with first, then other roles, then no role."""
    by_role: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in heads:
        by_role[entry.get("role") or ""].append(entry)

    def order(role: str) -> tuple[int, str]:
        if role in ROLE_ORDER:
            return ROLE_ORDER.index(role), ""
        return (len(ROLE_ORDER) + 2, "") if not role else (len(ROLE_ORDER) + (role == "sink"), role)

    return [(role, by_role[role]) for role in sorted(by_role, key=order)]


def group_edges(found: Any, heads: list[dict[str, Any]], side: str) -> list[tuple[str, str, float, int]]:
    """The group's edges on one side, by source: ``(source, its role, mean share over the group's
    heads where it is an edge, how many heads)``, strongest first."""
    keys = {(e["layer"], e["head"]) for e in heads}
    shares: dict[str, list[float]] = defaultdict(list)
    roles: dict[str, str] = {}
    for edge in found.edges:
        if edge["side"] == side and (edge["layer"], edge["head"]) in keys:
            shares[edge["source"]].append(edge["share"])
            roles[edge["source"]] = edge.get("role", "")
    ranked = sorted(shares, key=lambda s: (-len(shares[s]), -sum(shares[s])))
    return [(s, roles[s], sum(shares[s]) / len(shares[s]), len(shares[s])) for s in ranked]


def print_graph(result: Any, console: Any, top: int) -> None:
    from rich.markup import escape

    found = result.graph
    if found is None:
        return
    measure = (
        "contrast (answer against distractor at the final token)" if found.measure == "contrast" else "margin"
    )
    console.print(
        f"[bold]How heads compose[/bold] ({escape(found.data)}): {len(found.edges)} edges, each a source "
        f"with a share ≥ {found.threshold:g} of one side (its 95% interval above 0): queries and keys of "
        f"the head's {measure}, values of its output. By role group: the sources that are edges in "
        "most of the group's heads, with their mean share there"
    )
    groups = _groups(found.heads)
    if all(not role for role, _ in groups):  # no roles (labelled prompts): head by head
        groups = [("", [entry]) for entry in found.heads]
    for role, heads in groups[: max(top, 1)]:
        names = ", ".join(f"L{e['layer']}H{e['head']}" for e in heads[:6])
        more = f" and {len(heads) - 6} more" if len(heads) > 6 else ""
        if role:
            title = f"{role} heads ({names}{more})"
        else:
            title = names if len(heads) == 1 else f"heads with no role ({names}{more})"
        if len(heads) == 1 and found.measure == "contrast" and heads[0].get("margin") is not None:
            margin = heads[0]["margin"]
            title += f" (contrast {margin:+.2f} per prompt: {'the answer' if margin > 0 else 'the distractor'} preferred)"
        console.print(f"\n[bold]{escape(title)}[/bold]")
        for side in ("query", "key", "value"):
            listed = group_edges(found, heads, side)[:SHOWN]
            if not listed:
                console.print(f"  ← {LABELS[side]} (no edge)")
                continue
            text = " · ".join(
                f"{source}{f' ({r})' if r else ''} {share:.2f}"
                + (f" in {count} of {len(heads)}" if len(heads) > 1 else "")
                for source, r, share, count in listed
            )
            console.print(f"  ← {LABELS[side]} {escape(text)}")
    unresolved = [e for e in found.heads if e.get("unresolved")]
    if unresolved:
        console.print(
            f"\n{len(unresolved)} heads without query/key shares (their {found.measure} is not resolved "
            "against float rounding): in the JSON's unresolved"
        )
