"""``headscope icl`` for people: the ICL score, few-shot accuracy, the function vector's transfer,
and (--verify) which heads' removal costs which kind of ICL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from headscope import files
from headscope.extend.render import est, fmt, heads_text
from headscope.extend.writers import named


def print_icl(measures: Any, console: Console) -> None:
    """headscope icl: the ICL score, few-shot accuracy by shots, and the function vector's transfer."""
    score = measures.score
    if score is not None:
        console.print(
            f"[bold]ICL score[/bold] (loss at token {score.late} − loss at token {score.early}, "
            f"each ±{score.window} tokens, over {score.score.n} texts): {est(score.score)}"
        )
        # Each position averaged over ±window tokens, as the score's two ends are: the cells at the
        # early and late tokens differ by exactly the score (single tokens are noisy).
        w = score.window
        marks = {2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, score.early, score.late}
        shown = sorted(p for p in marks if w < p <= len(score.curve) - w)
        cells = " · ".join(f"{p}: {fmt(sum(score.curve[p - 1 - w : p + w]) / (2 * w + 1))}" for p in shown)
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
            table.add_row(task, *(est(by[(task, n)], 2) if (task, n) in by else "–" for n in shots))
        console.print(table)
    transfer = measures.transfer
    if transfer is not None:
        console.print(
            f"[bold]function vector[/bold] (top-{transfer.k} FV heads: {heads_text(transfer.heads)}; "
            f"tasks {', '.join(measures.fv_tasks)}), "
            f"added after layer {transfer.layer} (best of the layer sweep on half the queries), "
            f"zero-shot accuracy on the other half: none {est(transfer.zero_shot, 2)}, "
            f"function vector {est(transfer.function_vector, 2)}, "
            f"{transfer.k} random same-layer heads {est(transfer.random_vector, 2)} "
            f"({len(transfer.random_draws)} draws)",
            soft_wrap=True,
        )
        sweep = " ".join(f"{layer}:{acc:.2f}" for layer, acc in transfer.sweep)
        console.print(f"layer sweep (layer: accuracy on the selection half): {sweep}", soft_wrap=True)


def print_icl_ablation(check: Any, console: Console) -> None:
    """Yin and Steinhardt's comparison: the 2 × 3 table."""
    console.print(
        f"[bold]which heads matter for which ICL[/bold] ({check.mode} ablation of K={check.k} heads; "
        f"induction: {heads_text(check.heads['induction'], '–')}; FV: {heads_text(check.heads['fv'], '–')}; "
        f"top-K in both, left out: {heads_text(check.excluded, '–')}; random: {len(check.random_heads)} draws "
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
            est(check.clean[measure]),
            *(f"{est(row[n].value)} ({est(row[n].change)})" for n in ("induction", "fv", "random")),
        )
    console.print(table)


def sweep_panels(losses: Any) -> list[Any]:
    """The sweep plot's ICL panel (``headscope sweep --png``): the ICL score by step with its 95%
    interval, where the sweep's runs measured one."""
    icl = losses[losses["icl_score"].notna()] if "icl_score" in losses else losses.iloc[0:0]
    if not len(icl):
        return []

    def draw(ax: Any) -> None:
        steps = icl["step"].astype(float)
        ax.plot(steps, icl["icl_score"], marker="o", ms=3, color="#e8590c", label="ICL score")
        ax.fill_between(
            steps, icl["icl_score_low"].astype(float), icl["icl_score_high"].astype(float), alpha=0.2
        )
        ax.axhline(0.0, color="grey", lw=0.8, ls="--")
        ax.set_title("ICL score: late − early loss (nats)", fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)

    return [draw]


def save_icl_png(measures: Any, path: Path, title: str = "") -> None:
    """Mean next-token loss against token position (log x), with the ICL score's two windows marked."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    from matplotlib import pyplot as plt

    score = measures.score
    curve = np.asarray(score.curve, dtype=float)
    positions = np.arange(1, len(curve) + 1)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(positions, curve, lw=0.8, color="#adb5bd", label="mean over texts")
    # A running mean over a window that widens with position, so the log axis reads evenly.
    smooth = [np.nanmean(curve[max(0, p - 1 - p // 10) : p + p // 10]) for p in positions]
    ax.plot(positions, smooth, lw=1.8, color="#1c7ed6", label="smoothed (±10% of position)")
    for at, name in ((score.early, "early"), (score.late, "late")):
        ax.axvspan(at - score.window, at + score.window, color="#fab005", alpha=0.3)
        ax.text(at, ax.get_ylim()[1], name, ha="center", va="top", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("token position in the text")
    ax.set_ylabel("next-token loss (nats)")
    low, high = score.score.ci
    ax.set_title(
        (title + "\n" if title else "")
        + f"ICL score {score.score.mean:+.3f} [{low:+.3f}, {high:+.3f}] over {score.score.n} texts",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


@named("icl-png")
def icl_png(result: Any, path: Path, force: bool) -> str:
    """``--png``: the loss by token position."""
    with files.atomic_path(path, "--png", force) as tmp:
        save_icl_png(result.state["measures"], tmp, f"{result.model}: next-token loss by position")
    return str(path)
