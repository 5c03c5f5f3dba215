"""``headscope weights`` for people: the successor ablation check."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from headscope.extend.render import ablation_runs, fmt


def print_successor_ablation(result: Any, console: Console) -> None:
    """Next-ordinal accuracy and loss: intact, top-K successor heads ablated, random same-layer heads."""
    k = len(result.heads)
    console.print(
        f"[bold]successor ablation ({result.mode}) · {result.data}[/bold]: top-{k} successor heads vs {k} "
        f"random heads from the same layers ({len(result.random)} draws), on {result.clean.n} prompts of "
        'three consecutive members (e.g. "Monday, Tuesday, Wednesday," → " Thursday")'
    )
    console.print(ablation_runs(result, ("next-member accuracy", "loss (nats)"), lambda o: o.loss))
    mean_acc = sum(r.accuracy for r in result.random) / len(result.random)
    mean_loss = sum(r.loss for r in result.random) / len(result.random)
    console.print(
        f"accuracy {fmt(result.clean.accuracy)} → {fmt(result.ablated.accuracy)} (top heads) vs "
        f"{fmt(mean_acc)} (random, mean); loss {fmt(result.clean.loss)} → {fmt(result.ablated.loss)} vs "
        f"{fmt(mean_loss)}"
    )
