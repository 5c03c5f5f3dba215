"""``kv-plan`` for people and for servers: the terminal tables, plan.csv, DuoAttention's files, the curve."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from headscope import files
from headscope.extend.render import NUM_OR_NULL as _NUM_OR_NULL
from headscope.extend.render import check_fields, check_list, check_value, html_number, html_text

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


# --- the HTML report's kv-plan section (KVPlanAnalysis.html_section) --------------------------------


_KV_PLAN: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "method": (str,),
    "sink": (int,),
    "recent": (int,),
    "contexts": (list,),
    "layers": (int,),
    "kv_heads": (int,),
    "candidates": (int,),
    "notes": (list,),
    "heads": (list,),
    "sparsities": (list,),
}
_KV_HEAD: dict[str, tuple[type, ...]] = {
    "layer": (int,),
    "kv_head": (int,),
    "candidate": (bool,),
    "mass": _NUM_OR_NULL,
    "retrieval": _NUM_OR_NULL,
}
_KV_SPARSITY: dict[str, tuple[type, ...]] = {
    "sparsity": _NUM_OR_NULL,
    "n_streaming": (int,),
    "streaming": (list,),
    "plan": (dict, type(None)),
    "random_mean": (dict, type(None)),
    "memory": (list,),
}
_KV_MEMORY: dict[str, tuple[type, ...]] = {
    "context": (int,),
    "saved_share": _NUM_OR_NULL,
    "reduction": _NUM_OR_NULL,
}


def check_plan_data(plan: Any) -> None:
    check_fields("data['kv_plan']", plan, _KV_PLAN)
    check_list("data['kv_plan']['contexts']", plan["contexts"], (int,))
    check_list("data['kv_plan']['notes']", plan["notes"], (str,))
    for i, head in enumerate(plan["heads"]):
        where = f"data['kv_plan']['heads'][{i}]"
        check_fields(where, head, _KV_HEAD)
        for key, size in (("layer", plan["layers"]), ("kv_head", plan["kv_heads"])):
            if not 0 <= head[key] < size:
                raise ValueError(f"{where}[{key!r}]: outside the plan's {size} {key}s, got {head[key]}")
    for i, sparsity in enumerate(plan["sparsities"]):
        where = f"data['kv_plan']['sparsities'][{i}]"
        check_fields(where, sparsity, _KV_SPARSITY)
        for j, kv in enumerate(sparsity["streaming"]):
            check_value(f"{where}['streaming'][{j}]", kv, (list,))
            if len(kv) != 2:
                raise ValueError(f"{where}['streaming'][{j}]: expected [layer, kv_head], got {kv!r:.60}")
            check_list(f"{where}['streaming'][{j}]", kv, (int,))
        for j, memory in enumerate(sparsity["memory"]):
            check_fields(f"{where}['memory'][{j}]", memory, _KV_MEMORY)


def _size(value: float | None) -> str:
    return "\u2014" if value is None else human_bytes(value)


_KV_CSS = """/* KV-cache plan (kv-plan reports only) */
.kv-plan .kv-facts { margin: 0.3rem 0; font-size: 0.92rem; }
.kv-plans { display: flex; flex-wrap: wrap; gap: 1rem 1.75rem; align-items: flex-start; }
.kv-sparsity { margin: 0; }
.kv-sparsity figcaption { font-weight: 600; font-size: 0.92rem; margin-bottom: 0.25rem; }
.kv-grid { display: grid; gap: 2px; width: max-content; font-size: 0.72rem; margin-bottom: 0.45rem; }
.kv-grid .kv-colhead, .kv-grid .kv-rowhead { color: var(--muted); text-align: center; line-height: 1.1rem; font-variant-numeric: tabular-nums; }
.kv-grid .kv-rowhead { text-align: right; padding-right: 0.3rem; }
.kv-cell { width: 1.5rem; height: 1.1rem; border-radius: 2px; border: 1px solid rgba(0, 0, 0, 0.15); }
.kv-full { background: #2e9d57; }
.kv-streaming { background: #9aa0a6; }
.kv-window { background: #eef2ee; border-style: dashed; }
.kv-none { background: repeating-linear-gradient(45deg, #fff, #fff 3px, #f1f1f1 3px, #f1f1f1 6px); }
.kv-legend .kv-key { display: inline-flex; align-items: center; gap: 0.35rem; font-size: 0.9rem; }
table.kv-table { margin: 0; }
"""

_KV_LEGEND = (
    ("full", "full: keeps the whole context"),
    ("streaming", "streaming: attention sink + recent window only"),
    ("window", "window: not a candidate (a sliding-window layer)"),
    ("none", "no attention in this layer"),
)


def _kv_decisions(plan: dict[str, Any], sparsity: dict[str, Any]) -> dict[tuple[int, int], str]:
    streaming = {(int(layer), int(kv)) for layer, kv in sparsity["streaming"]}
    out = {}
    for head in plan["heads"]:
        kv = (head["layer"], head["kv_head"])
        out[kv] = "window" if not head["candidate"] else "streaming" if kv in streaming else "full"
    return out


def _kv_grid(plan: dict[str, Any], sparsity: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """One sparsity's KV heads as the role map lays heads out: a row per layer, a column per KV head."""
    decisions = _kv_decisions(plan, sparsity)
    heads = {(h["layer"], h["kv_head"]): h for h in plan["heads"]}
    counts = {"full": 0, "streaming": 0, "window": 0, "none": 0}
    parts = ['<span class="kv-corner"></span>']
    parts += [f'<span class="kv-colhead">{kv}</span>' for kv in range(plan["kv_heads"])]
    for layer in range(plan["layers"]):
        parts.append(f'<span class="kv-rowhead">L{layer}</span>')
        for kv in range(plan["kv_heads"]):
            decision = decisions.get((layer, kv), "none")
            counts[decision] += 1
            head = heads.get((layer, kv))
            title = f"layer {layer} \u00b7 KV head {kv} \u00b7 {decision}"
            if head is not None:
                queries = ",".join(str(q) for q in head.get("query_heads") or [])
                if queries:
                    title += f" (query heads {queries})"
                title += f" \u00b7 long-range mass {html_number(head['mass'])} \u00b7 retrieval {html_number(head['retrieval'])}"
                if head.get("ablation") is not None:
                    title += f" \u00b7 ablation \u0394loss {html_number(head['ablation'])}"
            parts.append(
                f'<span class="kv-cell kv-{decision}" data-decision="{decision}" data-layer="{layer}" '
                f'data-kv-head="{kv}" title="{html_text(title)}"></span>'
            )
    label = "KV heads by layer (rows) and KV head (columns): " + ", ".join(
        f"{n} {name}" for name, n in counts.items() if n
    )
    grid = (
        f'<div class="kv-grid" role="img" data-testid="kv-grid" aria-label="{html_text(label)}" '
        f'style="grid-template-columns:auto repeat({max(plan["kv_heads"], 1)}, 1.5rem)">'
        + "".join(parts)
        + "</div>"
    )
    return grid, counts


def _kv_table(plan: dict[str, Any], sparsity: dict[str, Any]) -> str:
    ours = sparsity["plan"] or {}
    mean = sparsity["random_mean"] or {}
    base = (plan.get("full") or {}).get("text_loss")
    n_random = int(sparsity.get("random_plans") or 0)
    if not n_random:
        random_head = "random mean"
    elif sparsity.get("random_exhaustive"):
        random_head = f"all {n_random} plans (mean)"
    else:
        random_head = f"{n_random} random plans (mean)"

    def delta(value: float | None) -> str:
        return html_number(None if value is None or base is None else value - base, sign="+")

    rows = [
        ("streaming", "streaming KV heads", f"{sparsity['n_streaming']} of {plan['candidates']}", None),
        ("accuracy", "needle accuracy", html_number(ours.get("accuracy")), html_number(mean.get("accuracy"))),
        (
            "answer_loss",
            "answer loss (nats)",
            html_number(ours.get("answer_loss")),
            html_number(mean.get("answer_loss")),
        ),
        ("text_loss", "text loss vs full (nats)", delta(ours.get("text_loss")), delta(mean.get("text_loss"))),
    ]
    body = []
    for metric, label, plan_cell, random_cell in rows:
        cells = (
            f'<td class="num" colspan="2">{html_text(plan_cell)}</td>'
            if random_cell is None
            else f'<td class="num">{html_text(plan_cell)}</td><td class="num">{html_text(random_cell)}</td>'
        )
        body.append(f'<tr data-metric="{metric}"><td>{html_text(label)}</td>{cells}</tr>')
    for memory in sparsity["memory"]:
        share, reduction = memory["saved_share"], memory["reduction"]
        saved = "\u2014" if share is None else f"{share:.0%}"
        if reduction is not None:
            saved += f" ({reduction:.2f}\u00d7)"
        title = f"{_size(memory.get('full_bytes'))} \u2192 {_size(memory.get('plan_bytes'))} per sequence"
        body.append(
            f'<tr data-metric="memory" data-context="{memory["context"]}">'
            f"<td>KV cache saved at {memory['context']} tokens</td>"
            f'<td class="num" colspan="2" title="{html_text(title)}">{html_text(saved)}</td></tr>'
        )
    return (
        '<table class="plain kv-table" data-testid="kv-table"><thead><tr><th></th><th>plan</th>'
        f"<th>{html_text(random_head)}</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    )


def _kv_section(plan: dict[str, Any]) -> str:
    """The ``kv-plan`` section: settings, a legend, and per sparsity a KV-head grid and a table."""
    total = len(plan["heads"])
    contexts = ", ".join(str(c) for c in plan["contexts"]) or "\u2014"
    facts = [
        f"model <b>{html_text(plan['model'])}</b>",
        f"ranked by <b>{html_text(plan['method'])}</b>",
        f"streaming heads keep sink {plan['sink']} + recent {plan['recent']} tokens",
        f"context{'s' if len(plan['contexts']) != 1 else ''} {html_text(contexts)} tokens",
        f"{plan['candidates']} of {total} KV heads are candidates",
    ]
    if plan.get("prompts") or plan.get("text_chunks"):
        facts.append(
            f"{plan.get('prompts', 0)} needle prompts, {plan.get('text_chunks', 0)} stretches of text"
        )
    full = plan.get("full") or {}
    if full:
        facts.append(
            f"full attention: needle accuracy {html_number(full.get('accuracy'))}, "
            f"answer loss {html_number(full.get('answer_loss'))}, text loss {html_number(full.get('text_loss'))} nats"
        )
    parts = [
        '<section id="kv-plan" class="kv-plan" data-testid="kv-plan" aria-labelledby="kv-plan-title">',
        '<h2 id="kv-plan-title">KV-cache plan</h2>',
        '<p class="kv-facts" data-testid="kv-facts">' + " \u00b7 ".join(facts) + "</p>",
    ]
    agreement = {k: v for k, v in (plan.get("agreement") or {}).items() if v is not None}
    if agreement:
        parts.append(
            '<p class="kv-facts">rank agreement with leave-one-out ablation (Spearman): '
            + html_text(", ".join(f"{name} {value:+.2f}" for name, value in agreement.items()))
            + "</p>"
        )
    if plan["notes"]:
        parts.append(
            '<ul class="notes" data-testid="kv-notes">'
            + "".join(f"<li>{html_text(note)}</li>" for note in plan["notes"])
            + "</ul>"
        )
    figures = []
    shown: set[str] = set()
    for sparsity in plan["sparsities"]:
        grid, counts = _kv_grid(plan, sparsity)
        shown |= {name for name, n in counts.items() if n}
        level = "?" if sparsity["sparsity"] is None else f"{sparsity['sparsity']:g}"
        figures.append(
            f'<figure class="kv-sparsity" data-testid="kv-sparsity" data-sparsity="{level}">'
            f"<figcaption>sparsity {level} \u00b7 {counts['full']} full, {counts['streaming']} streaming</figcaption>"
            + grid
            + _kv_table(plan, sparsity)
            + "</figure>"
        )
    legend = [
        f'<span class="kv-key"><span class="swatch kv-{name}" aria-hidden="true"></span>{html_text(text)}</span>'
        for name, text in _KV_LEGEND
        if name != "none" or name in shown
    ]
    parts.append('<div class="legend kv-legend" data-testid="kv-legend">' + "".join(legend) + "</div>")
    if figures:
        parts.append('<div class="kv-plans">' + "".join(figures) + "</div>")
    else:
        parts.append('<p class="empty">No sparsity was planned.</p>')
    parts.append("</section>\n")
    return "".join(parts)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def _evaluation(value: Any) -> dict[str, float | None] | None:
    if not isinstance(value, dict):
        return None
    return {k: _number(value.get(k)) for k in ("accuracy", "answer_loss", "text_loss")}


def plan_data(result: dict[str, Any]) -> dict[str, Any] | None:
    """``kv-plan``'s plan for the page: its settings, each KV head's scores, each sparsity's plan."""
    plan = result.get("kv_plan")
    if not isinstance(plan, dict):
        return None
    heads = [
        {
            "layer": int(h["layer"]),
            "kv_head": int(h["kv_head"]),
            "query_heads": [int(q) for q in h.get("query_heads") or []],
            "candidate": bool(h.get("candidate")),
            "mass": _number(h.get("mass")),
            "retrieval": _number(h.get("retrieval")),
            "ablation": _number(h.get("ablation")),
            "rank_score": _number(h.get("rank_score")),
        }
        for h in plan.get("heads") or []
    ]
    layers = int(plan.get("layers") or max((h["layer"] + 1 for h in heads), default=0))
    kv_heads = int(plan.get("kv_heads") or max((h["kv_head"] + 1 for h in heads), default=0))
    candidates = plan.get("candidates")
    n_candidates = len(candidates) if isinstance(candidates, list) else sum(h["candidate"] for h in heads)
    sparsities = []
    for s in plan.get("sparsities") or []:
        random = s.get("random") or []
        sparsities.append(
            {
                "sparsity": _number(s.get("sparsity")),
                "n_streaming": int(s.get("n_streaming") or 0),
                "streaming": [[int(layer), int(kv)] for layer, kv in s.get("streaming") or []],
                "plan": _evaluation(s.get("plan")),
                "random_mean": _evaluation(s.get("random_mean")),
                "random_plans": len(random) if isinstance(random, list) else 0,
                "random_exhaustive": bool(s.get("random_exhaustive")),
                "memory": [
                    {
                        "context": int(m["context"]),
                        "full_bytes": _number(m.get("full_bytes")),
                        "plan_bytes": _number(m.get("plan_bytes")),
                        "saved_share": _number(m.get("saved_share")),
                        "reduction": _number(m.get("reduction")),
                    }
                    for m in s.get("memory") or []
                ],
            }
        )
    agreement = plan.get("agreement") or {}
    return {
        "model": str(plan.get("model") or result.get("model") or ""),
        "method": str(plan.get("method") or ""),
        "sink": int(plan.get("sink") or 0),
        "recent": int(plan.get("recent") or 0),
        "contexts": [int(c) for c in plan.get("contexts") or []],
        "kv_dtype": str(plan.get("kv_dtype") or ""),
        "layers": layers,
        "kv_heads": kv_heads,
        "candidates": int(n_candidates),
        "prompts": int(plan.get("prompts") or 0),
        "text_chunks": int(plan.get("text_chunks") or 0),
        "full": _evaluation(plan.get("full")),
        "agreement": {str(k): _number(v) for k, v in agreement.items()}
        if isinstance(agreement, dict)
        else {},
        "notes": [str(n) for n in plan.get("notes") or []],
        "heads": heads,
        "sparsities": sparsities,
    }


def section_html(saved: dict[str, Any]) -> str | None:
    """The ``kv-plan`` section of the HTML report, from a result's JSON (None: it holds no plan).
    Its stylesheet comes first, in a ``<style>`` the report moves into the page's head."""
    plan = plan_data(saved)
    if plan is None:
        return None
    check_plan_data(plan)
    return f"<style>\n{_KV_CSS}</style>\n" + _kv_section(plan)


def plan_folder(result: Any, path: Path, force: bool) -> str:
    """``--out``: the plan's folder (DuoAttention's files, plan.csv, curve.png)."""
    written = write_plan_dir(result.kv_plan, path, force)
    return f"{len(written)} files to {Path(path)}"
