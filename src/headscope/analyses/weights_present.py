"""``headscope weights`` for people: its tables' captions and the successor ablation check."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from headscope.extend.render import ablation_runs, fmt


def weights_caption(section: Any, outcome: Any = None) -> str:
    """What a weights table's score, baseline and interval mean (``outcome``: the run's
    ``WeightOutcome``, whose task counts the successor tables name)."""
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
            f"{fmt(section.baseline)} (1 / task size); CI: 95% bootstrap over pairs"
        )
    baseline = f"{section.baseline:.2e}" if section.baseline is not None else "–"
    return (
        f"data: {section.description}; n = {section.n} tokens; baseline = k / vocabulary = {baseline}; "
        "CI: 95% bootstrap over tokens"
    )


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
