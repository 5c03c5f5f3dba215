"""``graph``'s causal check: each verified head's top source of a side removed from that side's input only.

For the ``n`` heads above layer 0 whose strongest edge has the largest share, and for each side
(query, key, value) that has an edge, the side's top source is removed from the head's layer's input
to that projection alone (:class:`~headscope.capture.edits.QueryOnly`, ``KeyOnly``, ``ValueOnly``:
the projection reads the block's own input norm of the stream less the source's write), on the
evaluation windows, and so, one at a time, are ``controls`` random lower sources (heads and MLPs,
never the top one). What each removal moves:

* **query** and **key** (measure ``attention``): the total variation ``½ Σ_k |A − A′|`` of the
  head's attention rows, averaged over the query rows read (qk's check, on both sides);
* **value** (measure ``output``): the relative change ``|o − o′| / |o|`` of what the head writes at
  the rows read, averaged, with ``o`` the head's slice of the attention output **after** its
  ``W_O`` slice (its write to the residual stream, without the output bias), as the value share
  measures it. The layer's attention does not move: only what it carries does;
* on labelled prompts (``contrast``; the rows read are the final token's): the query and key sides'
  measure is ``contrast``, the change of the head's preference ``A(answer) − A(distractor)`` (its
  attention summed over the answer's tokens, less that over the distractor's), its mean over
  prompts and the share of prompts whose preference flips sign (answer before and distractor after,
  or the reverse); the ratio is that of the mean absolute change.

The **ratio** is the top source's mean move over the random sources' (per window, their mean), with
a 95% bootstrap interval over windows; None, with a note, where the random sources' move is within
float rounding (``100 x`` float32 eps): a ratio to rounding is not a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from headscope.capture.edits import KeyOnly, QueryOnly, ValueOnly
from headscope.capture.hooks import hooked
from headscope.capture.sources import SourceWrites
from headscope.errors import InputError
from headscope.extend.base import model_batches
from headscope.models import anatomy, projections

from .graph_block import SIDES
from .qk import _attention_rows, _in_span, move_ratio

EDITS = {"query": QueryOnly, "key": KeyOnly, "value": ValueOnly}


@dataclass
class SideRemoval:
    """One (head, side): what removing the side's top source from that input moves, and what
    random lower sources move. ``move`` and ``control_move`` are in the side's ``measure``
    (``attention``: total variation; ``output``: relative change; ``contrast``: mean absolute change
    of the preference); ``change``, ``flips`` and their controls' are set in contrast mode only."""

    layer: int
    head: int
    side: str
    source: str
    share: float
    measure: str
    move: float
    controls: list[str]
    control_move: float
    ratio: float | None  # None where the random sources' move is within float rounding
    ci_low: float | None
    ci_high: float | None
    windows: int
    rows: str = "every query row read"
    rows_read: int = 0
    change: float | None = None  # contrast: mean over prompts of the preference's change, top source
    flips: float | None = None  # contrast: share of prompts whose preference flips sign, top source
    control_change: float | None = None  # the same, the random sources' mean
    control_flips: float | None = None
    note: str = ""  # why the ratio is None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class GraphRemovals:
    """The removals of :func:`verify_sides`, by head then side, and the heads not verified (why)."""

    removals: list[SideRemoval]
    skipped: list[str] = field(default_factory=list)
    contrast: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "contrast": self.contrast,
            "removals": [r.to_json() for r in self.removals],
            "skipped": list(self.skipped),
        }

    def print_to(self, console: Any, top: int) -> None:
        print_removals(self, console, top)


def verify_sides(
    loaded: Any,
    found: Any,
    state: dict[str, Any],
    n: int,
    controls: int,
    seed: int,
    n_resamples: int,
    progress: Any = None,
    contrast: list[torch.Tensor] | None = None,
) -> GraphRemovals:
    """Remove the top source of each side with an edge, for the ``n`` heads above layer 0 whose top
    edge share is largest (see the module docstring). ``found`` is a :class:`~.graph.GraphResult`;
    ``state`` the run's (``eval_pairs``, ``sample``, ``decomposers``, ``verify_rows``); ``contrast``
    each evaluation window's key weights ``[T]`` (labelled prompts: ``+1/|answer|`` on the
    answer's tokens, ``−1/|distractor|`` on the distractor's), whose signs name the two sets.

    ``n`` beyond the heads above layer 0 is refused before any pass (layer 0's heads read only the
    embedding); a head above it without an edge is not verified and is named in ``skipped``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"verify: k={n!r} must be a whole number of heads, at least 1")
    above = [e for e in found.heads if e["layer"] > 0]
    if n > len(above):
        raise InputError(
            f"verify: {n} heads asked for, but only {len(above)} of the {len(found.heads)} heads in the "
            "graph lie above layer 0 (layer 0's heads read only the embedding: no lower source to remove)",
            hint=f"ask for at most {len(above)} (k=, --verify), or take heads of later layers",
        )
    if contrast is not None and len(contrast) != len(state["eval_pairs"]):
        raise InputError(
            f"verify: {len(contrast)} contrast weights for {len(state['eval_pairs'])} evaluation windows",
            hint="give one [tokens] weight vector per evaluation window",
        )
    edges: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for edge in found.edges:
        if edge["layer"] > 0:
            edges.setdefault((edge["layer"], edge["head"]), []).append(edge)
    ranked = sorted(edges, key=lambda key: (-max(e["share"] for e in edges[key]), key))
    chosen = ranked[:n]
    without = [f"L{e['layer']}H{e['head']}" for e in above if (e["layer"], e["head"]) not in edges]
    skipped = [
        f"{name}: no edge (no source's share reaches {found.threshold:g} with its interval above 0)"
        for name in without
    ][: max(0, n - len(chosen))]
    plan = [(key, _top_edges(edges[key])) for key in chosen]
    rng = np.random.default_rng(seed)
    advance = progress("graph: verify", sum(len(tops) for _, tops in plan)) if progress is not None else None
    removals: list[SideRemoval] = []
    for (layer, head), tops in plan:
        removals += _verify_head(loaded, layer, head, tops, state, controls, rng, seed, n_resamples, contrast)
        if advance is not None:
            advance(len(tops))
    return GraphRemovals(removals, skipped, contrast is not None)


def check_verify(loaded: Any, n: int, heads: list[tuple[int, int]] | None) -> None:
    """``--verify n`` refused before any pass: more heads than lie above layer 0 among those asked
    for (``heads``; None: every head), or a layer among them whose attention has no separate query,
    key and value projections (each side's edit changes one projection's input alone)."""
    layout = loaded.layout
    every = [(layer, h) for layer in range(layout.n_layers) for h in range(layout.n_heads)]
    asked = every if heads is None else heads
    above = [(layer, h) for layer, h in asked if layer > 0]
    if n > len(above):
        raise InputError(
            f"--verify {n}: only {len(above)} of the {len(asked)} heads asked for lie above layer 0 "
            "(layer 0's heads read only the embedding: no lower source to remove)",
            hint=f"use --verify {len(above)}" if above else "add heads of later layers to --heads",
        )
    blocks = anatomy.blocks(loaded.model)
    for layer in sorted({layer for layer, _ in above}):
        attention = projections.attention_module(blocks[layer])
        names = projections.separate_qkv(attention)
        value = None
        if names is not None:
            try:
                value = attention.get_submodule(names[2])
            except AttributeError:
                value = None
        if value is None:
            raise InputError(
                f"--verify: {loaded.name}'s attention (layer {layer}, {type(attention).__name__}) has no "
                "separate query, key and value projections: a fused projection cannot be edited on one "
                "side alone",
                hint="drop --verify",
            )


def _top_edges(edges: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each side's strongest edge, in the order query, key, value."""
    tops = {}
    for side in SIDES:
        mine = [e for e in edges if e["side"] == side]
        if mine:
            tops[side] = max(mine, key=lambda e: e["share"])
    return tops


def mark_edges(found: Any, removals: GraphRemovals) -> None:
    """Write each removal's ratio onto the matching edge's ``verified_ratio`` (same head, side and
    source); edges not verified keep theirs."""
    ratios = {(r.layer, r.head, r.side, r.source): r.ratio for r in removals.removals}
    for edge in found.edges:
        key = (edge["layer"], edge["head"], edge["side"], edge["source"])
        if key in ratios:
            edge["verified_ratio"] = ratios[key]


# --- one head -------------------------------------------------------------------------------------------------


def _measured(
    loaded: Any, batches: list[Any], layer: int, head: int, sample: Any, **extra: Any
) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, torch.Tensor]]:
    """One pass: the head's attention rows per window with their positions (as qk reads them), and
    the head's output at the same positions ``[R, v_head_dim]`` (the output projection's input)."""
    attention = projections.attention_module(anatomy.blocks(loaded.model)[layer])
    width = loaded.layout.v_head_dim
    seen: dict[str, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    then = extra.pop("on_batch_done", None)

    def keep(_module: Any, args: tuple) -> None:
        seen["out"] = args[0][0, :, head * width : (head + 1) * width].detach()

    def done(batch: Any) -> None:
        out = seen.pop("out")
        picked = sample(batch)[0][: out.shape[0]].nonzero().squeeze(1)
        outputs[int(batch.example_index[0])] = out[picked.to(out.device)].cpu()
        if then is not None:
            then(batch)

    with hooked() as hooks:
        hooks.before(projections.output_module(attention), keep)
        rows = _attention_rows(loaded, batches, layer, head, sample, on_batch_done=done, **extra)
    for window, (_, positions) in rows.items():
        assert len(positions) == len(outputs[window])  # the same rows, in order
    return rows, outputs


def _verify_head(
    loaded: Any,
    layer: int,
    head: int,
    tops: dict[str, dict[str, Any]],
    state: dict[str, Any],
    controls: int,
    rng: np.random.Generator,
    seed: int,
    n_resamples: int,
    contrast: list[torch.Tensor] | None,
) -> list[SideRemoval]:
    pairs = state["eval_pairs"]
    sample = state["sample"]
    decomposer = state["decomposers"][layer]
    names = [s.name for s in decomposer.sources]
    picked: dict[str, list[str]] = {}
    for side, edge in tops.items():
        pool = [s.name for s in decomposer.sources if s.kind in ("head", "mlp") and s.name != edge["source"]]
        picked[side] = [str(x) for x in rng.choice(pool, size=min(controls, len(pool)), replace=False)]
    wanted = sorted({names.index(s) for side, edge in tops.items() for s in [edge["source"], *picked[side]]})
    batches = model_batches(loaded, [p[0] for p in pairs], [p[1] for p in pairs], 1)
    writes: dict[int, dict[int, torch.Tensor]] = {}
    recorder = SourceWrites(loaded, [layer])

    def record(batch: Any) -> None:
        every, bias = decomposer.writes(recorder.recorded[0])
        every = [*every, bias]  # the sources in source_names' order: bias last
        writes[int(batch.example_index[0])] = {i: every[i].float() for i in wanted}

    clean, clean_out = _measured(loaded, batches, layer, head, sample, reads=[recorder], on_batch_done=record)
    span = state.get("verify_rows")
    kept = {w: _in_span(positions, span) for w, (_, positions) in clean.items()}
    windows = sorted(w for w in clean if kept[w].any())
    if not windows:
        raise InputError(
            f"--verify: no sampled query row of L{layer}H{head} falls in the later copies",
            hint="raise --rows (0: every row), or --seq-len",
        )
    attention = projections.attention_module(anatomy.blocks(loaded.model)[layer])
    w_o = projections.output_projection(attention, loaded.layout.n_heads)[0][head].detach().double().cpu()
    rows = (
        "the final token"
        if contrast is not None
        else "every query row read"
        if span is None
        else f"the later copies' query rows (positions {span[0]}-{span[1] - 1})"
    )
    found = []
    for side, edge in tops.items():
        edit = EDITS[side]
        moves, changes, flips = [], [], []
        for name in [edge["source"], *picked[side]]:
            index = names.index(name)

            def removed(batch: Any, index: int = index) -> torch.Tensor:
                return writes[int(batch.example_index[0])][index][None]

            edited, edited_out = _measured(loaded, batches, layer, head, sample, edits=[edit(layer, removed)])
            if side == "value":
                moves.append([_output_move(clean_out[w], edited_out[w], w_o, kept[w]) for w in windows])
            elif contrast is None:
                # total variation: never negative (qk's measure)
                moves.append(
                    [
                        float((0.5 * (clean[w][0] - edited[w][0]).abs().sum(-1))[kept[w]].mean())
                        for w in windows
                    ]
                )
            else:
                before = [_preference(clean[w][0], contrast[w]) for w in windows]
                after = [_preference(edited[w][0], contrast[w]) for w in windows]
                change = [a - b for a, b in zip(after, before, strict=True)]
                changes.append(change)
                flips.append([float(a * b < 0) for a, b in zip(after, before, strict=True)])
                moves.append([abs(c) for c in change])
        measure = "output" if side == "value" else "contrast" if contrast is not None else "attention"
        removal = _ratio(layer, head, side, edge, measure, np.array(moves), picked[side], seed, n_resamples)
        removal.rows = rows
        removal.rows_read = int(sum(int(kept[w].sum()) for w in windows))
        if changes:
            change_array, flip_array = np.array(changes), np.array(flips)
            removal.change = float(change_array[0].mean())
            removal.flips = float(flip_array[0].mean())
            removal.control_change = float(change_array[1:].mean()) if len(change_array) > 1 else None
            removal.control_flips = float(flip_array[1:].mean()) if len(flip_array) > 1 else None
        found.append(removal)
    return found


def _output_move(clean: torch.Tensor, edited: torch.Tensor, w_o: torch.Tensor, kept: torch.Tensor) -> float:
    """``|o − o′| / |o|`` averaged over the rows kept, ``o`` the head's write ``out @ W_O[head]``."""
    before = clean.double() @ w_o
    after = edited.double() @ w_o
    size = before.norm(dim=-1).clamp(min=torch.finfo(torch.float32).tiny)
    return float(((after - before).norm(dim=-1) / size)[kept].mean())


def _preference(rows: torch.Tensor, weights: torch.Tensor) -> float:
    """The final row's attention summed over the answer's tokens (weights > 0) less that over the
    distractor's (weights < 0)."""
    row = rows[-1]
    weights = weights[: row.shape[0]]
    return float(row[weights > 0].sum() - row[weights < 0].sum())


def _ratio(
    layer: int,
    head: int,
    side: str,
    edge: dict[str, Any],
    measure: str,
    move: np.ndarray,  # [1 + controls, windows]
    controls: list[str],
    seed: int,
    n_resamples: int,
) -> SideRemoval:
    top_move = torch.tensor(move[0])
    control = torch.tensor(move[1:].mean(0)) if len(move) > 1 else torch.zeros_like(top_move)
    ratio, low, high, note = move_ratio(top_move, control, n_resamples, seed)
    return SideRemoval(
        layer,
        head,
        side,
        edge["source"],
        float(edge["share"]),
        measure,
        float(top_move.mean()),
        controls,
        float(control.mean()),
        ratio,
        low,
        high,
        move.shape[1],
        note=note,
    )


# --- the terminal ----------------------------------------------------------------------------------------------

MEASURES = {
    "attention": "attention moved: ½ Σ |A − A′| (total variation)",
    "output": "output moved: |o − o′| / |o|, o the head's write (after its W_O slice)",
    "contrast": (
        "preference moved: |Δ (A(answer) − A(distractor))| at the final token; Δ its mean change, "
        "flips the share of prompts whose preference changes sign"
    ),
}


def print_removals(removals: GraphRemovals, console: Any, top: int = 0) -> None:
    """A table of the removals (``top`` > 0: the first ``top`` heads' rows), then the notes, the
    heads not verified and what each measure is."""
    from rich.table import Table

    table = Table(title="Causal check: each side's top source removed from that input only")
    columns = ["head", "side", "source", "share", "moved", "random sources", "ratio [95% CI]"]
    if removals.contrast:
        columns += ["Δ preference", "flips", "random Δ", "random flips"]
    for column in columns:
        table.add_column(column)
    heads = list(dict.fromkeys((r.layer, r.head) for r in removals.removals))
    shown = set(heads[:top] if top > 0 else heads)
    listed = [r for r in removals.removals if (r.layer, r.head) in shown]
    for item in listed:
        ci = "" if item.ci_low is None else f" [{item.ci_low:.1f}, {item.ci_high:.1f}]"
        cells = [
            f"L{item.layer}H{item.head}",
            item.side,
            item.source,
            f"{item.share:.2f}",
            f"{item.move:.3f}",
            f"{item.control_move:.3f} ({len(item.controls)})",
            "—" if item.ratio is None else f"{item.ratio:.1f}{ci}",
        ]
        if removals.contrast:
            cells += [
                _signed(item.change),
                _share(item.flips),
                _signed(item.control_change),
                _share(item.control_flips),
            ]
        table.add_row(*cells)
    console.print(table)
    if len(listed) < len(removals.removals):
        console.print(f"and {len(heads) - len(shown)} more heads (in the JSON)", highlight=False)
    for item in listed:
        if item.note:
            console.print(f"L{item.layer}H{item.head} {item.side}: {item.note}", highlight=False)
    for line in removals.skipped:
        console.print(f"not verified: {line}", highlight=False)
    for measure in dict.fromkeys(r.measure for r in listed):
        rows = sorted({r.rows for r in listed if r.measure == measure})
        console.print(f"{MEASURES[measure]}, averaged over " + "; ".join(rows), highlight=False)


def _signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.3f}"


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


__all__ = ["GraphRemovals", "SideRemoval", "check_verify", "mark_edges", "print_removals", "verify_sides"]
