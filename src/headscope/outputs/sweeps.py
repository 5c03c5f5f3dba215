"""A sweep's summary for people: runs done, emergence by step, roles across models."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from headscope.extend.protocol import option

from .report import dataframe_table
from .terminal import err, say, wrote


@dataclass(kw_only=True)
class SweepPlot:
    png: Path | None = option(None, "Draw score trajectories (and the copy loss) against step.")
    top: int = option(3, "Heads per role in the PNG.", min=1)


def save_plot(result: Any, plot: SweepPlot) -> None:
    """``--png``: the score trajectories of the whole store (nothing to draw: no file)."""
    from headscope import files

    from .views import save_sweep_png

    if plot.png is not None and result.table is not None:
        with files.atomic_path(plot.png, "--png", True) as tmp:
            save_sweep_png(result.table, result.losses, tmp, top=plot.top)
        wrote(plot.png)


def print_run(run_key: str, outcome: dict) -> None:
    """One run finished (``hs.sweep``'s ``on_result``): a line on stderr."""
    status = "done" if outcome["ok"] else f"failed: {outcome['error']}"
    err.print(f"{run_key}: {status} ({outcome.get('seconds', 0):.1f} s)", soft_wrap=True)


def print_interrupted(exc: KeyboardInterrupt, store: Path) -> None:
    """Ctrl-C during a sweep: what the store keeps (a ``SweepInterrupted`` says it: how many runs)."""
    kept = f"the runs finished so far are kept in the store {store}"
    say(str(exc) or f"interrupted: {kept}; run the same sweep again to compute the rest")


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
