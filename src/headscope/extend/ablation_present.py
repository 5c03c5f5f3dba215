"""The ablation checks for people: the induction ablation (clean vs top-K vs random-K later-copy
loss) and the table checks (each table's top-K heads ablated), printed by their check types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from headscope import files

from .render import fmt, fmt_ci, heads_text
from .writers import named


def print_ablation(result: Any, console: Console) -> None:
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

    def row(name: str, heads: str, estimate: Any) -> None:
        delta = estimate.mean - result.clean.mean
        table.add_row(
            name,
            heads,
            fmt(estimate.mean),
            fmt_ci(estimate.ci[0], estimate.ci[1]),
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
            heads_text(check.heads),
            fmt(check.best_score),
            fmt(check.clean),
            f"{check.topk_effect:+.3f}",
            f"{check.random_effect:+.3f}",
        )
    console.print(table)
    console.print(
        "loss (nats) measured on: repeated-token detectors, the later copies; sink, the natural text; "
        "syntax, the dependents' tokens; coref, the pronouns' tokens"
    )


@named("ablation-json")
def ablation_json(result: Any, path: Path, force: bool) -> str | None:
    """``--json``: the ablation check's record (nothing without one)."""
    if not result.checks:
        return None
    text = json.dumps(result.checks[0].to_json(), indent=2) + "\n"
    return str(files.write_atomic(path, text, "--json", force))
