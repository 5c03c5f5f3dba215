"""A sweep's summary for people: runs done, emergence by step, roles across models."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from .report import dataframe_table


def print_sweep(result: Any, n_analyses: int, console: Console) -> None:
    """``result`` is a ``sweep.run.SweepResult``: counts, failures, and its two summary tables."""
    runs = len(result.targets) * n_analyses
    console.print(
        f"sweep: {runs} runs ({len(result.targets)} models x {n_analyses} analyses): "
        f"{len(result.computed)} computed, {len(result.skipped)} already in the store, "
        f"{len(result.failed)} failed; {result.seconds:.1f} s",
        soft_wrap=True,
    )
    for run_key, reason in result.failed.items():
        console.print(f"failed: {run_key}: {reason}", soft_wrap=True)
    if result.table is None:
        return
    rise = result.emergence()
    if len(rise):
        console.print(
            "[bold]emergence[/bold] (per role table: best score first → last step, where it rose most, where the repeated-copy loss and the ICL score dropped most, and the first step each head held the role)"
        )
        console.print(dataframe_table(rise))
    models = result.across_models()
    if len(models):
        console.print(
            "[bold]roles across models[/bold] (last step of each series): heads per role and mean depth (layer + 0.5) / layers"
        )
        console.print(dataframe_table(models))
    console.print(
        f"wrote {result.folder / 'sweep.csv'} ({len(result.table)} rows) and {result.folder / 'manifest.json'}",
        soft_wrap=True,
    )
