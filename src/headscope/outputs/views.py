"""Looking at heads: terminal heatmaps and PNGs of one text's maps, and the model's layout.

The maps themselves come from :mod:`headscope.extend.show`. Nothing here runs the model or needs
typer; the CLI's ``show`` and ``info`` commands are thin wrappers.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.style import Style
from rich.text import Text

from headscope.capture import STREAM_IMPLEMENTATION
from headscope.errors import InputError
from headscope.extend.protocol import option
from headscope.extend.show import AttentionView
from headscope.models import LoadedModel
from headscope.models.layout import layer_attention

# ----------------------------------------------------------------------------- the model's layout


def model_info(loaded: LoadedModel) -> dict[str, Any]:
    """The attention layout read from the live config and module tree, and the decompositions
    checked on the model."""
    from headscope.capture import checks

    layout = loaded.layout
    config = loaded.model.config
    groups = [
        [head for head in range(layout.n_heads) if layout.kv_group(head) == group]
        for group in range(layout.n_kv_heads)
    ]
    if layout.n_kv_heads == layout.n_heads:
        kind = "multi-head (MHA)"
    elif layout.n_kv_heads == 1:
        kind = "multi-query (MQA)"
    else:
        kind = "grouped-query (GQA)"
    architectures = getattr(config, "architectures", None) or [type(loaded.model).__name__]
    return {
        "model": loaded.name,
        "source": loaded.source,
        "architecture": architectures[0],
        "model_type": getattr(config, "model_type", ""),
        "causal": loaded.is_causal,
        "layers": layout.n_layers,
        "query_heads": layout.n_heads,
        "kv_heads": layout.n_kv_heads,
        "attention": kind,
        "heads_per_kv_group": layout.group_size,
        "kv_groups": groups,
        "head_dim": layout.head_dim,
        "d_model": layout.d_model,
        "context": layout.max_positions,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        # What the analyses run: capture.prepared switches to it (and back, for a caller's model).
        "attn_implementation": (
            STREAM_IMPLEMENTATION
            if loaded.capture_mode == "stream"
            else getattr(config, "_attn_implementation", None)
        ),
        "capture": loaded.capture_mode,
        "vocab_size": getattr(config, "vocab_size", None),
        "layer_attention": layer_attention(config, layout.n_layers),
        # Each decomposition checked on the model itself (headscope.capture.checks); a refused one
        # carries its reason, and the analyses that need it refuse with the same reason.
        "checks": {view: checks.check(loaded, view).to_json() for view in checks.VIEWS},
    }


def info_data(loaded: LoadedModel) -> dict[str, Any]:
    """``headscope info``: :func:`model_info` and the value head dim (values can be narrower than
    queries and keys: DeepSeek's latent attention, MiMo)."""
    data = model_info(loaded)
    data["value_head_dim"] = loaded.layout.v_head_dim
    return data


def info_csv(data: dict[str, Any]) -> str:
    """:func:`info_data` as one CSV row: KV groups as "0,1 2,3", each check as text."""
    import pandas as pd

    from headscope.outputs import report

    flat = {
        k: (" ".join(",".join(map(str, g)) for g in v) if k == "kv_groups" else v)
        for k, v in data.items()
        if k not in ("layer_attention", "checks")
    }
    for view, found in data["checks"].items():
        flat[f"check_{view}"] = report.check_text(found)
    flat["layer_attention"] = data["layer_attention"]["summary"]
    return report.table_csv(pd.DataFrame([flat]), list(flat))


def print_info(data: dict[str, Any], console: Console) -> None:
    """The table at its natural width, each line printed with soft wrapping: Rich would fold the
    source row's absolute paths at the console's width, which breaks them for copying and makes the
    lines depend on where the files are. A terminal too narrow wraps them."""
    import io

    from headscope.outputs import report

    wide = Console(
        file=io.StringIO(),
        width=10_000,
        color_system=console.color_system,
        no_color=console.no_color,
        highlight=False,
        legacy_windows=False,
    )
    report.print_info(data, wide)
    for line in wide.file.getvalue().splitlines():
        text = Text.from_ansi(line)
        text.rstrip()  # cells are padded to the widest row
        console.print(text, soft_wrap=True)
    if data["value_head_dim"] != data["head_dim"]:
        console.print(f"value head dim: {data['value_head_dim']} (queries and keys: {data['head_dim']})")


# ----------------------------------------------------------------------------- terminal heatmaps

_SHADES = " ·░▒▓█"


def _shade(weight: float) -> tuple[str, Style]:
    level = 0 if weight < 0.02 else min(len(_SHADES) - 1, 1 + int(weight * (len(_SHADES) - 1)))
    # Light yellow to dark red, by weight (colour is dropped under NO_COLOR or without a TTY).
    t = max(0.0, min(1.0, weight))
    red, green, blue = int(255 - 60 * t), int(245 - 215 * t), int(200 - 170 * t)
    return _SHADES[level], Style(color=f"rgb({red},{green},{blue})")


def _cell_width(label: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in label)


def _fit(label: str, width: int) -> str:
    """Cut ``label`` to ``width`` terminal columns (CJK counts 2), marking a cut with …."""
    if _cell_width(label) <= width:
        return label
    out = ""
    for ch in label:
        if _cell_width(out + ch) > width - 1:
            break
        out += ch
    return out + "…"


def heatmap(view: AttentionView, head_index: int, title: str | None = None) -> RenderableType:
    """One head's map: query tokens down the left, key tokens written vertically across the top."""
    weights = view.weights[head_index]
    labels = view.labels
    n = len(labels)
    row_width = min(14, max(_cell_width(label) for label in labels) + 5)
    # Column headers: each label vertically, one character per line, two columns per cell.
    height = min(6, max(len(label) for label in labels))
    lines: list[Text] = []
    for depth in range(height):
        line = Text(" " * row_width)
        for label in labels:
            ch = label[depth] if depth < len(label) else ""
            if depth == height - 1 and len(label) > height:
                ch = "…"
            line.append(ch + " " * (2 - _cell_width(ch)) if ch else "  ", style="bold")
        lines.append(line)
    for q in range(n):
        label = _fit(f"{q:>2} {labels[q]}", row_width - 1)
        line = Text(label + " " * (row_width - _cell_width(label)))
        for k in range(n):
            ch, style = _shade(float(weights[q, k]))
            line.append(ch * 2, style=style)
        best = int(weights[q].argmax())
        line.append(f" → {best} {labels[best]} {float(weights[q, best]):.2f}", style="dim")
        lines.append(line)
    heading = Text(title or f"layer {view.layer} head {view.heads[head_index]}", style="bold")
    legend = Text(
        f"rows: {view.unit} attending (query); columns: {view.unit} attended (key); shade: weight ",
        style="dim",
    )
    for value in (0.1, 0.3, 0.5, 0.7, 0.9):
        ch, style = _shade(value)
        legend.append(ch * 2, style=style)
        legend.append(f"{value:.1f} ", style="dim")
    return Group(heading, *lines, legend)


def grid(view: AttentionView, columns: int = 80) -> RenderableType:
    """Small panels, one per head, one character per cell, with a shared label legend."""
    n = len(view.labels)
    panel_width = n + 2
    per_row = max(1, columns // (panel_width + 1))
    blocks: list[RenderableType] = [
        Text(f"layer {view.layer}: {len(view.heads)} heads, {n} {view.unit}s each way", style="bold")
    ]
    for first in range(0, len(view.heads), per_row):
        chunk = list(range(first, min(len(view.heads), first + per_row)))
        header = Text()
        for index in chunk:
            title = f"H{view.heads[index]}"
            header.append(title + " " * (panel_width + 1 - len(title)), style="bold")
        blocks.append(header)
        for q in range(n):
            line = Text()
            for index in chunk:
                for k in range(n):
                    ch, style = _shade(float(view.weights[index, q, k]))
                    line.append(ch, style=style)
                line.append(" " * 3)
            blocks.append(line)
        blocks.append(Text())
    legend = " ".join(f"{i}:{label}" for i, label in enumerate(view.labels))
    blocks.append(Text(f"rows = queries, columns = keys, in order: {legend}", style="dim"))
    return Group(*blocks)


VIEW_COLUMNS = ["layer", "head", "unit", "query", "query_label", "key", "key_label", "weight"]


def view_rows(view: AttentionView) -> list[dict[str, Any]]:
    """Long form for CSV/JSON: one row per (head, query, key)."""
    rows = []
    for index, head in enumerate(view.heads):
        for q, q_label in enumerate(view.labels):
            for k, k_label in enumerate(view.labels):
                rows.append(
                    {
                        "layer": view.layer,
                        "head": head,
                        "unit": view.unit,
                        "query": q,
                        "query_label": q_label,
                        "key": k,
                        "key_label": k_label,
                        "weight": round(float(view.weights[index, q, k]), 6),
                    }
                )
    return rows


def window(view: AttentionView, start: int, max_tokens: int) -> tuple[AttentionView, str | None]:
    """``headscope show``'s window of ``view`` (refused past the end), and a note when it is not all."""
    total = len(view.labels)
    if start >= total:
        raise InputError(f"--start {start} is past the end: the text has {total} {view.unit}s")
    shown = view.window(start, max_tokens)
    if len(shown.labels) == total:
        return shown, None
    return shown, (
        f"showing {view.unit}s {start}–{start + len(shown.labels) - 1} of {total}; "
        "move the window with --start, widen it with --max-tokens"
    )


# The cat sentence: a pronoun whose antecedent is 13 tokens back, and a repeat (induction) to see.
DEFAULT_TEXT = "The cat sat on the mat. The cat sat on the mat because it was tired."


@dataclass(kw_only=True)
class ShowOptions:
    """What ``hs.show`` shows (its keywords) and ``headscope show``'s flags of the same names."""

    layer: int = option(0, "Layer to show (0-based).", flag=("--layer", "-l"))
    heads: int | list[int] | str = option(
        0, "A head (3), a list (0,2,5) or all; several heads give a grid.", flag="--head", cli_type=str
    )
    text: str = option(DEFAULT_TEXT, "The text to run.")
    words: bool = option(False, "Word-level attention (the syntax detector's alignment).")
    word_sep: str | None = option(None, "With --words: a character that marks word boundaries in --text.")


@dataclass(kw_only=True)
class ShowWindow:
    """How ``headscope show`` draws the map ``hs.show`` returns."""

    png: Path | None = option(None, "Also draw the heatmap into this PNG.")
    start: int = option(0, "First token of the window shown.", min=0)
    max_tokens: int = option(40, "Tokens per axis in the terminal (and PNG).", min=2)


def print_attention(attention: Any, emit: Any, shown: ShowWindow) -> None:
    """``headscope show``'s output of an ``AttentionMap``: the window's note, the map in ``--format``
    to stdout or ``-o`` (:func:`headscope.outputs.terminal.write_output`), ``--png``, the cost ledger."""
    import time

    from headscope import files

    from .terminal import err, print_profile, write_output, wrote

    started = time.perf_counter()
    view, note = window(attention.view, shown.start, shown.max_tokens)
    if note is not None:
        err.print(note, soft_wrap=True)
    write_output(
        emit,
        lambda console: print_view(view, console),
        lambda: view_csv(view),
        lambda: view_json(view, attention.model),
    )
    if shown.png is not None:
        with files.atomic_path(shown.png, "--png", emit.force) as tmp:
            for warning in save_png(view, tmp):
                err.print(f"warning: {warning}", soft_wrap=True)
        wrote(shown.png)
    if attention.profile is not None:
        print_profile(attention.profile, attention.profile.load_seconds, started)


def print_view(view: AttentionView, console: Console) -> None:
    """One head's heatmap, or several heads' grid."""
    if len(view.heads) == 1:
        console.print(heatmap(view, 0))
    else:
        console.print(grid(view, columns=max(60, console.width)))


def view_csv(view: AttentionView) -> str:
    import pandas as pd

    from headscope.outputs import report

    return report.table_csv(pd.DataFrame(view_rows(view)), VIEW_COLUMNS)


def view_json(view: AttentionView, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "layer": view.layer,
        "heads": view.heads,
        "unit": view.unit,
        "labels": view.labels,
        "rows": view_rows(view),
    }


# ----------------------------------------------------------------------------- PNG


def font_for(labels: Sequence[str]) -> tuple[str | None, list[str]]:
    """A font file whose glyphs cover every character of ``labels``, else (None, missing chars).

    Looks through the fonts matplotlib knows, DejaVu Sans (its default) first.
    """
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    needed = {ord(ch) for label in labels for ch in label if not ch.isspace()}
    default = font_manager.findfont("DejaVu Sans")
    # Last Resort fonts map every code point to a "missing glyph" box, which would hide the problem.
    others = {f.fname for f in font_manager.fontManager.ttflist if "lastresort" not in f.fname.lower()}
    paths = [default, *sorted(others - {default})]
    best_missing: set[int] | None = None
    for path in paths:
        try:
            charmap = FT2Font(path).get_charmap()
        except Exception:  # noqa: BLE001 - an unreadable font is skipped
            continue
        missing = needed - set(charmap)
        if not missing:
            return path, []
        if best_missing is None or len(missing) < len(best_missing):
            best_missing = missing
    return None, sorted(chr(c) for c in (best_missing or needed))


def save_png(view: AttentionView, path: Path) -> list[str]:
    """Draw the heads of ``view`` into ``path`` (one panel per head). Returns warnings."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import font_manager
    from matplotlib import pyplot as plt

    warnings = []
    font_path, missing = font_for(view.labels)
    font = None
    if font_path is not None:
        font = font_manager.FontProperties(fname=font_path)
    else:
        shown = "".join(missing[:10])
        warnings.append(
            f"no installed font has the glyphs {shown!r}; those labels will show as boxes "
            "(install a CJK font such as fonts-noto-cjk, then delete matplotlib's font cache)"
        )
    n_panels = len(view.heads)
    n = len(view.labels)
    cols = 1 if n_panels == 1 else min(n_panels, math.ceil(math.sqrt(n_panels)))
    rows = math.ceil(n_panels / cols)
    size = max(4.0, min(14.0, 0.28 * n + 1.5)) if n_panels == 1 else max(2.5, min(6.0, 0.12 * n + 1))
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    tick_labels = n <= 60
    image = None
    for index in range(rows * cols):
        ax = axes[index // cols][index % cols]
        if index >= n_panels:
            ax.axis("off")
            continue
        image = ax.imshow(view.weights[index].numpy(), cmap="Reds", vmin=0.0, vmax=1.0)
        ax.set_title(f"layer {view.layer} head {view.heads[index]}", fontsize=10)
        if tick_labels:
            fontsize = 8 if n_panels == 1 else 5
            ax.set_xticks(range(n))
            ax.set_yticks(range(n))
            ax.set_xticklabels(view.labels, rotation=90, fontsize=fontsize, fontproperties=font)
            ax.set_yticklabels(view.labels, fontsize=fontsize, fontproperties=font)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_xlabel(f"key ({view.unit})", fontsize=8)
        ax.set_ylabel(f"query ({view.unit})", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")
    import warnings as warnings_module

    with warnings_module.catch_warnings():
        warnings_module.simplefilter("ignore")  # missing-glyph warnings are reported once, above
        fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return warnings


def save_sweep_png(table: Any, losses: Any, path: Path, top: int = 3, title: str = "") -> None:
    """Trajectories across steps: for each role table, the score of the heads that end up in the
    top ``top``, with their 95% intervals as bands; the repeated-copy loss beside the induction score,
    and each analysis' own panels on the same step axis (``Analysis.sweep_panels(losses)``: a list
    of functions that draw on one matplotlib axis, such as the score by step of a plugin's measure)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    stepped = table[table["step"].notna()]
    series = list(dict.fromkeys(stepped["series"]))[:1]
    part = stepped[stepped["series"].isin(series)]
    groups = [
        (keys, group)
        for keys, group in part.groupby(["analysis", "data", "detector", "relation", "direction"], sort=False)
        if group["step"].nunique() >= 2
    ]
    loss = losses[losses["series"].isin(series)].sort_values("step") if len(losses) else losses
    own = _sweep_panels(loss)
    loss = loss[loss["later"].notna()] if "later" in loss else loss
    panels = len(groups) + (1 if len(loss) else 0) + len(own)
    if panels == 0:
        raise InputError("--png: no role changes across steps to draw (give a folder of checkpoints)")
    columns = min(3, panels)
    rows = (panels + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (keys, group) in zip(flat, groups, strict=False):
        last = group[group["step"] == group["step"].max()].sort_values("score", ascending=False)
        for layer, head in zip(last["layer"].head(top), last["head"].head(top), strict=False):
            line = group[(group["layer"] == layer) & (group["head"] == head)].sort_values("step")
            steps = line["step"].astype(float)
            ax.plot(steps, line["score"], marker="o", ms=3, label=f"L{layer}H{head}")
            if line["ci_low"].notna().any():
                ax.fill_between(steps, line["ci_low"].astype(float), line["ci_high"].astype(float), alpha=0.2)
        baseline = group.groupby("step")["baseline"].mean()
        ax.plot(baseline.index.astype(float), baseline.values, ls="--", color="grey", lw=1, label="baseline")
        ax.set_title(" · ".join(str(k) for k in keys[1:] if k), fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("score")
        ax.legend(fontsize=7)
    if len(loss):
        ax = flat[len(groups)]
        ax.plot(loss["step"].astype(float), loss["first"], marker="o", ms=3, label="first copy")
        ax.plot(loss["step"].astype(float), loss["later"], marker="o", ms=3, label="later copies")
        ax.set_title("repeated-copy loss (nats)", fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax, draw in zip(flat[len(groups) + (1 if len(loss) else 0) :], own, strict=False):
        draw(ax)
    for ax in flat[panels:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _sweep_panels(losses: Any) -> list[Any]:
    """Every analysis' own panels of a sweep plot (``sweep_panels(losses)``, where it declares one)."""
    from headscope.analyses import ANALYSES

    found: list[Any] = []
    if not len(losses):
        return found
    for analysis in ANALYSES.values():
        panels = getattr(analysis, "sweep_panels", None)
        if callable(panels):
            found += list(panels(losses) or [])
    return found
