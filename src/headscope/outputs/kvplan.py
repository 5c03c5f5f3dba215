"""``kv-plan`` for people and for servers: the terminal tables, plan.csv, DuoAttention's files, the curve."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from headscope import files

FULL, STREAMING, WINDOW = "█", "·", "w"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(row: dict[str, Any], key: str) -> str:
    low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
    return "n/a" if low is None or high is None else f"{low:.2f}–{high:.2f}"


def human_bytes(value: float) -> str:
    """A byte count in B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover


def verdict(result: Any) -> tuple[str, float | None]:
    """'better' / 'no better' / 'n/a' and the plan's needle-accuracy margin over the random mean."""
    mean = result.random_mean("accuracy")
    if mean is None:
        return "n/a", None
    margin = result.plan.accuracy - mean
    loss_margin = (result.random_mean("answer_loss") or 0.0) - result.plan.answer_loss
    better = margin > 0 or (margin == 0 and loss_margin > 0)
    return ("better" if better else "no better"), margin


def print_kv_plan(plan: Any, console: Console, top: int = 10) -> None:
    n = len(plan.candidates)
    console.print(
        f"[bold]kv-plan · {plan.model}[/bold]: rank {n} candidate KV heads by {plan.method}; streaming heads keep "
        f"sink {plan.sink} + recent {plan.recent} tokens; {plan.n_prompts} needle prompts at "
        f"{','.join(str(c) for c in plan.contexts)} tokens, {plan.n_text} stretches of natural text",
        soft_wrap=False,
    )
    if plan.applied_contexts:
        console.print(
            f"plans applied at {','.join(str(c) for c in plan.applied_contexts)} tokens (--apply-context): "
            f"{plan.applied_prompts} needle prompts, {plan.applied_text} stretches of natural text; "
            "the full-attention reference below is theirs",
            soft_wrap=False,
        )
    for note in plan.notes:
        console.print(f"[dim]note: {note}[/dim]")
    full = plan.full
    console.print(
        f"full attention: needle accuracy {_fmt(full.accuracy)}, answer loss {_fmt(full.answer_loss)} nats, "
        f"text loss {_fmt(full.text_loss)} nats (positions past the window)"
    )
    table = Table(
        title=f"KV heads that most need the full context, by {plan.method} (mass: long-range attention mass)",
        title_justify="left",
    )
    for column in ("rank", "layer", "KV", "query heads", "mass", "95% CI", "retrieval", "95% CI"):
        table.add_column(column, justify="right")
    if plan.method == "ablation":
        table.add_column("Δ loss", justify="right")
        table.add_column("95% CI", justify="right")
    by_kv = {(r["layer"], r["kv_head"]): r for r in plan.rows}
    for rank, kv in enumerate(plan.ranked[:top], start=1):
        row = by_kv[kv]
        cells = [
            str(rank),
            str(row["layer"]),
            str(row["kv_head"]),
            " ".join(str(h) for h in row["query_heads"]),
            _fmt(row["mass"]),
            _ci(row, "mass"),
            _fmt(row["retrieval"]),
            _ci(row, "retrieval"),
        ]
        if plan.method == "ablation":
            cells += [_fmt(row["ablation"], 2), _ci(row, "ablation")]
        table.add_row(*cells)
    console.print(table)
    if plan.agreement:
        console.print(
            "rank agreement with leave-one-out ablation (Spearman, over the candidates): "
            + ", ".join(f"{name} {value:+.2f}" for name, value in plan.agreement.items())
        )
    print_plan_table(plan, console)
    print_grid(plan, console)


def print_plan_table(plan: Any, console: Console) -> None:
    if not plan.sparsities:
        return
    table = Table(
        title="each plan applied, and random plans of the same size (mean of the draws)", title_justify="left"
    )
    for column in ("sparsity", "plan", "streaming", "needle acc", "answer loss", "text Δloss"):
        table.add_column(column, justify="right")
    base = plan.full.text_loss

    def delta(value: float | None) -> str:
        return "–" if value is None or base is None else f"{value - base:+.3f}"

    verdicts = []
    for result in plan.sparsities:
        kind, margin = verdict(result)
        count = f"{result.n_streaming}/{len(plan.candidates)}"
        table.add_row(
            f"{result.sparsity:g}",
            plan.method,
            count,
            _fmt(result.plan.accuracy),
            _fmt(result.plan.answer_loss),
            delta(result.plan.text_loss),
        )
        for method, (_, other) in result.others.items():
            table.add_row(
                "", method, count, _fmt(other.accuracy), _fmt(other.answer_loss), delta(other.text_loss)
            )
        if result.random:
            which = f"all {len(result.random)}" if result.exhaustive else f"{len(result.random)}"
            table.add_row(
                "",
                f"random ×{which}" if not result.exhaustive else f"random, {which}",
                count,
                _fmt(result.random_mean("accuracy")),
                _fmt(result.random_mean("answer_loss")),
                delta(result.random_mean("text_loss")),
                end_section=True,
            )
        else:
            table.add_row(*[""] * 6, end_section=True)
        if margin is None:
            verdicts.append(f"  sparsity {result.sparsity:g}: every plan of this size is the same one")
            continue
        accuracies = [e.accuracy for e in result.random]
        colour = "green" if kind == "better" else "yellow"
        loss = result.plan.answer_loss - (result.random_mean("answer_loss") or 0.0)
        verdicts.append(
            f"  sparsity {result.sparsity:g}: plan {result.plan.accuracy:.3f}, random {min(accuracies):.3f}–"
            f"{max(accuracies):.3f} (mean {sum(accuracies) / len(accuracies):.3f}): [{colour}]{kind} than "
            f"random[/{colour}] (accuracy {margin:+.3f}, answer loss {loss:+.3f})"
        )
    console.print(table)
    console.print(f"needle accuracy, the {plan.method} plan against random plans:")
    for line in verdicts:
        console.print(line)
    first = plan.sparsities[0].memory
    lines = []
    for result in plan.sparsities:
        parts = [
            f"{m['saved_share']:.0%} ({m['reduction']:.2f}x) at {m['context']} tokens" for m in result.memory
        ]
        lines.append(f"  sparsity {result.sparsity:g}: saves " + ", ".join(parts))
    full = ", ".join(f"{human_bytes(m['full_bytes'])} at {m['context']} tokens" for m in first)
    console.print(f"KV cache per sequence ({plan.kv_dtype}, computed from the layout): full {full}")
    for line in lines:
        console.print(line)


def print_grid(plan: Any, console: Console) -> None:
    """The KV-head grid at each sparsity: one row per KV head, one column per layer."""
    if not plan.sparsities:
        return
    layout = plan.layout
    console.print(
        f"KV-head grid ([green]{FULL}[/green] full, [dim]{STREAMING}[/dim] streaming, {WINDOW} the model's own "
        "window); columns are layers 0.."
        f"{layout.n_layers - 1}"
    )
    tens = "".join(str(layer // 10) if layer % 10 == 0 else " " for layer in range(layout.n_layers))
    ones = "".join(str(layer % 10) for layer in range(layout.n_layers))
    width = max(len(f"sparsity {r.sparsity:g} KV {layout.n_kv_heads - 1}") for r in plan.sparsities)
    console.print(" " * (width + 2) + tens, soft_wrap=True, highlight=False)
    console.print(" " * (width + 2) + ones, soft_wrap=True, highlight=False)
    attention = set(layout.attention_layers)
    for result in plan.sparsities:
        for kv in range(layout.n_kv_heads):
            label = f"sparsity {result.sparsity:g} KV {kv}".ljust(width + 2)
            line = Text(label)
            for layer in range(layout.n_layers):
                if layer not in attention:
                    line.append(" ")
                    continue
                decision = plan.decision((layer, kv), result)
                if decision == "full":
                    line.append(FULL, style="green")
                elif decision == "streaming":
                    line.append(STREAMING, style="dim")
                else:
                    line.append(WINDOW, style="dim")
            console.print(line, soft_wrap=True, highlight=False)


# --- files -------------------------------------------------------------------------------------------------

PLAN_COLUMNS = (
    "layer",
    "kv_head",
    "query_heads",
    "candidate",
    "mass",
    "mass_low",
    "mass_high",
    "mass_needles",
    "mass_text",
    "retrieval",
    "retrieval_low",
    "retrieval_high",
    "ablation",
    "ablation_low",
    "ablation_high",
    "rank_score",
)


def plan_csv(plan: Any) -> str:
    """One row per KV head: its query heads, each score, and the decision at each sparsity."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*PLAN_COLUMNS, *(f"plan_{r.sparsity:g}" for r in plan.sparsities)])
    for row in plan.rows:
        cells = []
        for column in PLAN_COLUMNS:
            value = row[column]
            if column == "query_heads":
                value = " ".join(str(h) for h in value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, float):
                value = f"{value:.6g}"
            elif value is None:
                value = ""
            cells.append(value)
        kv = (row["layer"], row["kv_head"])
        cells += [plan.decision(kv, r) for r in plan.sparsities]
        writer.writerow(cells)
    return out.getvalue()


def _matrix(plan: Any, value: Any) -> str:
    """A layers x KV-heads matrix, tab-separated, one line per layer (DuoAttention's TSV)."""
    lines = []
    for layer in range(plan.layout.n_layers):
        lines.append("\t".join(f"{value((layer, kv)):.6f}" for kv in range(plan.layout.n_kv_heads)))
    return "\n".join(lines) + "\n"


def duo_files(plan: Any) -> dict[str, str]:
    """DuoAttention's ``full_attention_heads.tsv`` and ``config.json``: at the top, each KV head's rank
    score in [0, 1] (1 = needs the full context most; layers that are not candidates: 1, they keep
    their own attention), which DuoAttention's ``sparsify_attention_heads`` thresholds at any
    sparsity; in ``sparsity-S/``, the plan at S as 0/1 (1 = full attention)."""
    scores = {(r["layer"], r["kv_head"]): r["rank_score"] for r in plan.rows}
    meta = {
        "model": plan.model,
        "method": plan.method,
        "contexts": plan.contexts,
        "candidates": len(plan.candidates),
        "made_by": "headscope kv-plan",
    }
    if len(plan.candidates) < len(plan.rows):
        meta["note"] = (
            "KV heads of sliding-window layers are not candidates and hold 1 here; DuoAttention's quantile "
            "over this whole matrix is then not headscope's sparsity: use the sparsity-S folders"
        )
    out = {
        "full_attention_heads.tsv": _matrix(plan, lambda kv: scores.get(kv, 1.0)),
        "config.json": json.dumps(
            {"sink_size": plan.sink, "recent_size": plan.recent, "headscope": meta}, indent=2
        )
        + "\n",
    }
    for result in plan.sparsities:
        folder = f"sparsity-{result.sparsity:g}"
        streamed = set(result.streaming)
        out[f"{folder}/full_attention_heads.tsv"] = _matrix(
            plan, lambda kv, s=streamed: 0.0 if kv in s else 1.0
        )
        config = {
            "sink_size": plan.sink,
            "recent_size": plan.recent,
            "headscope": {**meta, "sparsity": result.sparsity, "streaming_kv_heads": len(streamed)},
        }
        out[f"{folder}/config.json"] = json.dumps(config, indent=2) + "\n"
    return out


def save_curve_png(plan: Any, path: Path) -> None:
    """Sparsity against needle accuracy and answer loss, plan against random, memory saved on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    results = plan.sparsities
    xs = [r.sparsity for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in (
        (left, "accuracy", "needle accuracy"),
        (right, "answer_loss", "answer loss (nats)"),
    ):
        plan_values = [getattr(r.plan, key) for r in results]
        means = [r.random_mean(key) for r in results]
        lows = [min((getattr(e, key) for e in r.random), default=getattr(r.plan, key)) for r in results]
        highs = [max((getattr(e, key) for e in r.random), default=getattr(r.plan, key)) for r in results]
        ax.plot(xs, plan_values, "o-", color="#2b8a3e", label=f"plan ({plan.method})")
        others = sorted({m for r in results for m in r.others})
        for method, colour in zip(others, ("#9c36b5", "#e03131"), strict=False):
            values = [
                getattr(r.others[method][1], key) if method in r.others else float("nan") for r in results
            ]
            ax.plot(xs, values, "d-.", color=colour, label=f"plan ({method})")
        ax.plot(
            xs,
            [m if m is not None else float("nan") for m in means],
            "s--",
            color="#868e96",
            label="random (mean)",
        )
        ax.fill_between(xs, lows, highs, color="#adb5bd", alpha=0.3, label="random (min–max)")
        ax.axhline(getattr(plan.full, key), color="#1c7ed6", linestyle=":", label="full attention")
        ax.set_xlabel("sparsity (share of candidate KV heads streaming)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    left.set_ylim(-0.02, 1.02)
    memory = left.twinx()
    context = results[0].memory[0]["context"] if results and results[0].memory else None
    memory.plot(
        xs, [r.memory[0]["saved_share"] * 100 for r in results], "^:", color="#e8590c", label="KV cache saved"
    )
    memory.set_ylabel(f"KV cache saved at {context} tokens (%)", color="#e8590c")
    memory.set_ylim(0, 100)
    handles, labels = left.get_legend_handles_labels()
    more, more_labels = memory.get_legend_handles_labels()
    left.legend(handles + more, labels + more_labels, fontsize=7, loc="lower left")
    fig.suptitle(
        f"{plan.model}: kv-plan by {plan.method}, sink {plan.sink} + recent {plan.recent}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def plan_files(sparsities: Any) -> list[str]:
    """Every file ``--out`` writes, for these sparsities."""
    names = ["full_attention_heads.tsv", "config.json", "plan.csv", "curve.png"]
    for sparsity in sparsities:
        names += [f"sparsity-{sparsity:g}/full_attention_heads.tsv", f"sparsity-{sparsity:g}/config.json"]
    return names


def check_plan_dir(out: str | Path, force: bool = False, sparsities: Any = ()) -> list[str]:
    """Refuse, before the model loads, an --out that is a file, in a missing folder, or (without
    --force) that already holds any file the plan would write. Returns the ``sparsity-*`` folders
    already there that this plan will not rewrite (an earlier run's)."""
    folder = Path(out).expanduser()
    if not folder.exists():
        files.check_writable(folder, "--out", force)
        return []
    if not folder.is_dir():
        from headscope.errors import OutputError

        raise OutputError(f"--out {out}: is a file, not a folder", hint="give a folder path")
    for name in plan_files(sparsities):
        target = folder / name
        if target.parent.is_dir() or target.parent == folder:
            files.check_writable(target, "--out", force)
        elif target.parent.exists():
            files.check_writable(target, "--out", force)  # a file where the folder goes: refused
    ours = {f"sparsity-{s:g}" for s in sparsities}
    return sorted(p.name for p in folder.glob("sparsity-*") if p.is_dir() and p.name not in ours)


def write_plan_dir(plan: Any, out: str | Path, force: bool = False) -> list[Path]:
    """DuoAttention's files, plan.csv and curve.png in ``out``; each written atomically."""
    check_plan_dir(out, True, [r.sparsity for r in plan.sparsities])
    folder = Path(out).expanduser()
    folder.mkdir(exist_ok=True)
    written = []
    texts = {**duo_files(plan), "plan.csv": plan_csv(plan)}
    for name, text in texts.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        written.append(files.write_atomic(target, text, "--out", force))
    if plan.sparsities:
        target = folder / "curve.png"
        with files.atomic_path(target, "--out", force) as tmp:
            save_curve_png(plan, tmp)
        written.append(target)
    return written
