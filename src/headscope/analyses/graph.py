"""``graph``: how heads compose. Every head's query, key and value sources, measured on data, kept
as edges where they carry a clear share, and drawn as one graph.

Each head is decomposed as ``qk`` does (:mod:`headscope.analyses.qk`), with the value side added:

* **query** and **key**: each source's share of the head's **margin** (attention-weighted score
  minus the mean score), or, on labelled prompts (``--data``), of its **contrast** at the final
  token: the mean score of the answer's keys minus the mean score of the distractor's keys (every
  occurrence of each; IOI: the indirect object against the subject), with ``A − 1/n`` replaced by
  the keys' weights ``+1/|answer|`` and ``−1/|distractor|``;
* **value**: each source's share of what the head writes, ``Σ_q <o_b(q), o(q)> / Σ_q |o(q)|²``
  with ``o(q) = Σ_k A[q,k] v(k) W_O`` (before any post-attention norm) and ``o_b`` the part that
  source b's write carries through the frozen input norm and ``W_V`` (measure ``output``).

Every share has a 95% bootstrap interval over the evaluation windows (prompts). An **edge** is a
(head, side, source) whose share is at least ``--threshold`` and whose interval excludes 0. The
default threshold, 0.1, keeps a source that carries a tenth of a side: a head below layer l has
about 10 sources per layer beneath it, so a share spread evenly over a 30-layer model's sources
is about 0.003, and 0.1 is 30 times that; sources with a negative share (working against the head)
are not edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.errors import InputError
from headscope.extend.base import Report
from headscope.extend.protocol import Analysis, Outcome, Output, option, register
from headscope.verdicts.results import CSV_COLUMNS, HIDDEN_COLUMNS

from . import qk
from .graph_block import EDGE, SIDES, check_graph_block
from .graph_page import write_graph_html
from .qk import QK, QKInputs, QKOptions, explain, parse_heads

THRESHOLD = 0.1
# --edges: the model, then what each edge of the JSON block requires (declared once, in graph_block)
EDGE_COLUMNS = ["model", *EDGE["required"]]


@dataclass(kw_only=True)
class GraphOptions(QKOptions):
    data: Path | None = option(
        None,
        "Labelled prompts, IOI's format (YAML or JSONL: text, io, s; as headscope ioi --data): at "
        "the final token the query and key sides split the contrast, the answer's (io) keys against "
        "the distractor's (s, every occurrence). Default: qk's data (--repeat-seq, --eval-text, the "
        "shipped texts) and its margin.",
        cli_type=Path | None,
    )
    threshold: float = option(
        THRESHOLD,
        "An edge: a source whose share of a side is at least this, its 95% interval above 0.",
        min=0.0,
        max=1.0,
    )


@dataclass
class GraphInputs:
    qk: QKInputs
    labelled: Any  # an IOISet, or None


@dataclass
class GraphResult:
    """What graph found: each head's three sides (as qk's heads, with ``value``), and the edges."""

    heads: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    data: str
    measure: str  # margin or contrast (the query and key sides); the value side's is output
    threshold: float
    windows: dict[str, int]
    check: dict[str, float]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "data": self.data,
            "measure": self.measure,
            "threshold": self.threshold,
            "windows": self.windows,
            "check": self.check,
            "heads": self.heads,
            "edges": self.edges,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "graph block") -> GraphResult:
        """Read back a saved ``graph`` block, checked against its schema and invariants
        (:func:`headscope.analyses.graph_block.check_graph_block`)."""
        check_graph_block(data, source)
        return cls(
            data["heads"],
            data["edges"],
            data.get("data", ""),
            data["measure"],
            data["threshold"],
            data.get("windows", {}),
            data.get("check", {}),
        )

    def edges_table(self, model: str) -> pd.DataFrame:
        """One row per edge (:data:`EDGE_COLUMNS`)."""
        return pd.DataFrame.from_records(
            [{"model": model, **edge} for edge in self.edges], columns=EDGE_COLUMNS
        )

    def head(self, layer: int, head: int) -> dict[str, Any]:
        for entry in self.heads:
            if entry["layer"] == layer and entry["head"] == head:
                return entry
        raise KeyError(f"L{layer}H{head}")


def edges_of(heads: list[dict[str, Any]], threshold: float, measure: str) -> list[dict[str, Any]]:
    """The (head, side, source) whose share is at least ``threshold`` with a 95% interval above 0
    (without intervals, ``--resamples 0``: the share alone), strongest first within each head."""
    found = []
    for entry in heads:
        for side in SIDES:
            for item in entry.get(side, []):
                share = item.get("share")
                if share is None or share < threshold:
                    continue
                if item.get("ci_low") is not None and item["ci_low"] <= 0:
                    continue
                found.append(
                    {
                        "layer": entry["layer"],
                        "head": entry["head"],
                        "side": side,
                        "source": item["source"],
                        "kind": item.get("kind", ""),
                        "role": item.get("role", ""),
                        "share": share,
                        "ci_low": item.get("ci_low"),
                        "ci_high": item.get("ci_high"),
                        "n": entry["windows"],
                        "measure": "output" if side == "value" else measure,
                        "verified_ratio": None,
                    }
                )
    return found


# --- labelled prompts: the contrast at the final token ---------------------------------------------------


def contrast_windows(loaded: Any, labelled: Any, seed: int) -> tuple[list[Any], list[torch.Tensor]]:
    """Each prompt as an (ids, special) window, and its key weights ``[T]``: ``+1/|io|`` on the
    answer's tokens, ``−1/|s|`` on every token of each occurrence of the distractor."""
    from .ioi import encode_ioi

    clean, _, _ = encode_ioi(loaded, labelled, seed)
    pairs, weights = [], []
    for prompt in clean:
        answer = prompt.targets["io"]
        distractor = sorted({*prompt.targets["s1"], *prompt.targets["s2"]})
        w = torch.zeros(len(prompt.ids), dtype=torch.float64)
        w[answer] += 1.0 / len(answer)
        w[distractor] -= 1.0 / len(distractor)
        pairs.append((prompt.ids, prompt.special))
        weights.append(w)
    return pairs, weights


class FinalRow:
    """The rows read on labelled prompts: each window's last real token (where the answer is due)."""

    def __call__(self, batch: Any) -> torch.Tensor:
        mask = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
        last = batch.attention_mask.sum(-1) - 1
        mask[torch.arange(mask.shape[0]), last] = True
        return mask


# --- the analysis -----------------------------------------------------------------------------------------


def graph(
    loaded: Any, options: GraphOptions, prepared: GraphInputs, progress: Any = None
) -> tuple[Report, GraphResult, dict[str, Any]]:
    """Every chosen head's three sides and the edges; see the module docstring."""
    contrast = None
    sample = None
    if prepared.labelled is not None:
        pairs, weights = contrast_windows(loaded, prepared.labelled, options.seed)
        half = len(pairs) // 2
        fit, held = pairs[:half], pairs[half:]
        contrast = (weights[:half], weights[half:])
        data, measure, later = f"{prepared.labelled.name} ({len(held)} prompts evaluated)", "contrast", None
        sample = FinalRow()
    else:
        fit, held, data, later = qk._windows(loaded, options, prepared.qk)
        measure = "margin"
    found, state = explain(
        loaded,
        fit,
        held,
        data,
        prepared.qk.heads,
        rows=options.rows or None,
        seed=options.seed,
        n_resamples=options.resamples,
        repeated=bool(options.repeat_seq),
        progress=progress,
        value=True,
        contrast=contrast,
        sample=sample,
    )
    notes = list(found.notes)
    if contrast is not None:
        notes.append(
            "no roles on labelled prompts (the detectors need more than each prompt's final row): "
            "headscope ioi and headscope scan name them"
        )
    if not options.resamples:
        notes.append("no intervals (--resamples 0): edges kept by their share alone")
    result = GraphResult(
        found.heads,
        edges_of(found.heads, options.threshold, measure),
        data,
        measure,
        options.threshold,
        found.windows,
        found.check,
        notes,
    )
    report = Report(
        loaded.name,
        tidy_rows(loaded.name, result),
        [],
        loaded.capture_mode,
        notes=notes,
        layout=loaded.layout,
    )
    return (
        report,
        result,
        {
            **state,
            "qk": found,
            "verify_rows": later,
            "contrast": None if contrast is None else contrast[1],
        },
    )


def tidy_rows(model: str, result: GraphResult) -> pd.DataFrame:
    """The edges in the project's CSV columns (``--csv``): ``detector`` graph, ``relation`` the side,
    ``direction`` the source, ``score`` its share, ``rank`` its rank among the head's edges on that
    side; ``baseline`` the verified ratio where the edge was checked."""
    rows = []
    ranks: dict[tuple[int, int, str], int] = {}
    for edge in result.edges:
        key = (edge["layer"], edge["head"], edge["side"])
        ranks[key] = ranks.get(key, 0) + 1
        rows.append(
            {
                "model": model,
                "detector": "graph",
                "relation": edge["side"],
                "direction": edge["source"],
                "layer": edge["layer"],
                "head": edge["head"],
                "kv_group": next(
                    (e["kv_group"] for e in result.heads if (e["layer"], e["head"]) == key[:2]), np.nan
                ),
                "score": edge["share"],
                "baseline": edge["verified_ratio"],
                "ci_low": edge["ci_low"],
                "ci_high": edge["ci_high"],
                "n": edge["n"],
                "rank": ranks[key],
                "role": "",
                "data": edge["measure"],
            }
        )
    table = pd.DataFrame.from_records(rows, columns=CSV_COLUMNS)
    for column in [*HIDDEN_COLUMNS, "p_adj", "strength"]:
        table[column] = np.nan
    return table


def write_edges(result: Any, path: Path, force: bool) -> str:
    """``--edges``: one row per edge (:data:`EDGE_COLUMNS`), written atomically."""
    from headscope import files

    text = result.graph.edges_table(result.model).to_csv(index=False)
    return str(files.write_atomic(path, text, "--edges", force))


@register
class Graph(Analysis):
    name = "graph"
    summary = (
        "How heads compose: every head's query, key and value sources measured on data (a share of "
        "its margin, or of the answer-against-distractor contrast on labelled prompts, and of its "
        "output), kept as edges where the share is clear, with the causal check."
    )
    options = GraphOptions
    print_sections = False
    takes_capture = False
    outputs = (
        Output(
            "--edges",
            "Write one row per edge to this CSV (atomic): model, layer, head, side (query|key|value), "
            "source, share, ci_low, ci_high, n, measure (margin|contrast|output), verified_ratio.",
            write_edges,
            first=True,
        ),
        Output(
            "--html",
            "Write the head graph as a self-contained HTML page (the report's shell, offline): layers as "
            "rows, heads coloured by role, edges by side; click a head for its sources; #L3H1 opens it.",
            write_graph_html,
            first=True,
        ),
    )

    def check(self, options: GraphOptions) -> GraphInputs:
        labelled = None
        if options.data is not None:
            if options.repeat_seq or options.eval_text is not None:
                raise InputError("give --data, or --repeat-seq / --eval-text, not both")
            from headscope.data.circuits import load_ioi

            labelled = load_ioi(options.data)
            if len(labelled.items) < 4:
                raise InputError(
                    f"--data {options.data}: {len(labelled.items)} prompts; graph needs at least 4 "
                    "(half rank the sources, half measure them)"
                )
        return GraphInputs(QK().check(options), labelled)

    def check_loaded(self, loaded: Any, options: GraphOptions) -> None:
        if options.data is None:
            QK().check_loaded(loaded, options)
        else:  # labelled prompts: qk's model checks without its windows (the prompts are the windows)
            reason = qk.refusal(loaded)
            if reason is not None:
                from headscope.errors import Unsupported

                raise Unsupported(f"graph: {loaded.name} ({loaded.model.config.model_type}): {reason}")
            if not loaded.is_causal:
                raise InputError(
                    "graph --data reads the final token's choice: it needs a causal language model"
                )
            qk.check_heads(loaded, options.heads)
        if options.verify:
            from .graph_verify import check_verify

            check_verify(loaded, options.verify, parse_heads(options.heads))

    def run(self, loaded: Any, options: GraphOptions, prepared: GraphInputs, progress: Any) -> Outcome:
        report, result, state = graph(loaded, options, prepared, progress)
        return Outcome(report, state={"graph": result, **state})

    def wants_verify(self, options: GraphOptions) -> bool:
        return options.verify > 0

    def verify(
        self, loaded: Any, outcome: Outcome, options: GraphOptions, progress: Any, k: int | None = None
    ) -> list[Any]:
        """Each verified head's top source of each side removed from that side's input only
        (graph_verify: QueryOnly, KeyOnly, ValueOnly), its ratio to random lower sources written on
        the matching edge; on labelled prompts, the change of the answer-against-distractor
        preference and the share of prompts it flips."""
        from headscope.extend.checks import Check

        from .graph_verify import mark_edges, verify_sides

        found: GraphResult = outcome.state["graph"]
        removals = verify_sides(
            loaded,
            found,
            outcome.state,
            k or options.verify,
            options.controls,
            options.seed,
            options.resamples,
            progress,
            contrast=outcome.state.get("contrast"),
        )
        mark_edges(found, removals)
        outcome.report.table = tidy_rows(loaded.name, found)
        return [Check("graph-removal", removals)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        out = {"graph": outcome.state["graph"].to_json()}
        checks = [c.to_json() for c in outcome.checks]
        if checks:
            out["verification"] = checks
        return out

    def present(self, result: Any, console: Any, top: int) -> None:
        from .graph_present import print_graph

        print_graph(result, console, top)

    def html_section(self, result: Any) -> str | None:
        from .graph_page import html_section

        return html_section(result)
