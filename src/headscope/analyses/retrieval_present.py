"""``headscope retrieval`` for people: the needle table and summary, and the ablation check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from headscope import files
from headscope.extend.render import ablation_runs, fmt
from headscope.extend.writers import named


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
        f"needle accuracy {right}/{outcome.n} = {fmt(outcome.accuracy)} (every answer token top-1, "
        f"as greedy decoding would give it); answer loss {fmt(outcome.answer_loss)} nats; "
        f"{outcome.counted} of {outcome.answer_tokens} answer tokens predicted right (the retrieval score's n)"
    )


def print_needles(outcome: Any, console: Console) -> None:
    """The needle outcome above a retrieval table: its summary line and the accuracy grid."""
    console.print(needle_summary(outcome))
    console.print(needle_table(outcome))


def print_retrieval_ablation(result: Any, console: Console) -> None:
    """Needle accuracy and answer loss: intact, top-K retrieval heads ablated, random same-layer heads."""
    k = len(result.heads)
    where = f" · {result.data}" if result.data else ""
    console.print(
        f"[bold]ablation ({result.mode}){where}[/bold]: top-{k} retrieval heads vs {k} random heads "
        f"from the same layers ({len(result.random)} draws)"
    )
    console.print(ablation_runs(result, ("needle accuracy", "answer loss (nats)"), lambda o: o.answer_loss))
    mean_random = sum(r.accuracy for r in result.random) / len(result.random)
    console.print(
        f"needle accuracy {fmt(result.clean.accuracy)} → {fmt(result.ablated.accuracy)} with the top heads "
        f"ablated, → {fmt(mean_random)} (mean) with random heads"
    )


def save_needle_png(outcome: Any, path: Path, title: str = "") -> None:
    """Needle accuracy by context length (rows) and depth (columns), as the usual NIAH heatmap."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    contexts = list(dict.fromkeys(c["context"] for c in outcome.cells))
    depths = list(dict.fromkeys(c["depth"] for c in outcome.cells))
    cells = {(c["context"], c["depth"]): c for c in outcome.cells}
    grid = [[cells[(c, d)]["accuracy"] for d in depths] for c in contexts]
    fig, ax = plt.subplots(figsize=(1.2 * len(depths) + 2.5, 0.6 * len(contexts) + 1.8))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(depths)))
    ax.set_xticklabels([f"{d:g}" for d in depths])
    ax.set_yticks(range(len(contexts)))
    ax.set_yticklabels([str(c) for c in contexts])
    ax.set_xlabel("needle depth (0 = start of the context)")
    ax.set_ylabel("context (tokens)")
    for i, context in enumerate(contexts):
        for j, depth in enumerate(depths):
            cell = cells[(context, depth)]
            ax.text(j, i, f"{cell['correct']}/{cell['n']}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="needle accuracy")
    if title:
        ax.set_title(title, fontsize=10)
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)


@named("needle-png")
def needle_png(result: Any, path: Path, force: bool) -> str:
    """``--png``: needle accuracy by context and depth."""
    with files.atomic_path(path, "--png", force) as tmp:
        save_needle_png(result.state["needle"], tmp, f"{result.model}: {result.state['title']}")
    return str(path)
