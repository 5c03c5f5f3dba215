"""``qk``: why a head attends where it does. Its attention scores split exactly over the components
that write its queries and keys, each source's share of the head's choice, and a causal check.

For each head and each query read, the **margin** is how much higher the head's attention-weighted
score is than the mean score over the keys it may see::

    m(q) = Σ_k A[q,k] s(q,k) − mean_k s(q,k) = Σ_k (A[q,k] − 1/n_q) s(q,k)      (always ≥ 0)

The score is a sum over (query source, key source) pairs (:mod:`headscope.capture.sources`), so the
margin splits exactly by key source (queries held at their total) and by query source (keys held at
their total). A source's **share** on a side is ``Σ_q m_b(q) / Σ_q m(q)``: a side's shares sum to
1, and a share is negative where the source works against the head's choice.

The windows are split in two: the **fit** split picks each head's top sources, the **evaluation**
split measures everything that is reported (shares with 95% bootstrap intervals over windows, the
top pairs, the reconstructed attention, the causal check), so no reported number is measured on the
data that chose it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope import capture
from headscope.capture import Attention, Pass
from headscope.capture.dla import attention_layers
from headscope.capture.edits import KeyOnly
from headscope.capture.sources import (
    Decomposer,
    HeadTops,
    Prepared,
    Source,
    SourceWrites,
    WindowParts,
    refusal,
    source_names,
)
from headscope.detectors import create as create_detectors
from headscope.errors import HeadscopeError, InputError, Unsupported
from headscope.extend.base import (
    RepeatSpec,
    Report,
    check_context,
    detectors_for,
    model_batches,
    repeated_tokens,
)
from headscope.extend.protocol import (
    Analysis,
    Outcome,
    Output,
    Stats,
    check_common,
    option,
    register,
    split_names,
)
from headscope.models import anatomy, projections
from headscope.verdicts.results import CSV_COLUMNS, HIDDEN_COLUMNS, head_table
from headscope.verdicts.roles import assign_roles, head_roles
from headscope.verdicts.stats import MIN_EXAMPLES, bootstrap_ratio

from .describe.fit import RowSample
from .describe.texts import balanced, check_langs, shipped_sources, user_text_sources, windows
from .qk_block import SCORE_TOLERANCE, check_qk_block

RECONSTRUCT_K = (0, 1, 3, 10, 30)  # sources kept on each side (0: every source at its mean)
PAIRS = 6  # top sources per side whose pairs are measured
EXAMPLE_KEYS = 5  # keys shown for the example query
EXAMPLE_SOURCES = 4  # key sources each example key's score is split by (the rest summed)
LISTED = 12  # sources per (head, side) listed in the tidy rows (the rest summed as "rest")
# A head's margin is resolved where it exceeds this many times its rounding bound, eps * sum A|s|
# (eps: the attention weights' dtype): the margin's error from rounding is then under 1% of it.
RESOLVE = 100
SIDES = ("key", "query")


# --- options and inputs -------------------------------------------------------------------------------


@dataclass(kw_only=True)
class QKOptions(Stats):
    heads: str | None = option(
        None, "Heads to explain (comma list like L18H6,L17H8); default: every head.", cli_type=str | None
    )
    context: int = option(256, "Tokens per text window (BOS first).", min=16)
    lang: str = option(
        "en",
        "Languages of the shipped texts (comma list: en, zh).",
        check=lambda value: _check_langs(value),
    )
    eval_text: Path | None = option(
        None,
        "Evaluate on this UTF-8 text file instead of the shipped evaluation split (paragraphs "
        "separated by blank lines, each cut into --context windows); the top sources are still "
        "picked on the shipped fit split.",
    )
    repeat_seq: int = option(
        0,
        "Run on repeated random tokens instead of text: N copies of --seq-len random tokens (the "
        "induction protocol); 0: text.",
        min=0,
    )
    seq_len: int = option(50, "Random tokens per copy with --repeat-seq.", min=2)
    windows: int = option(
        6,
        "Windows (or random sequences) per split: the fit split picks each head's top sources, the "
        f"evaluation split measures them (intervals need at least {MIN_EXAMPLES}).",
        min=1,
    )
    rows: int = option(
        64,
        "Query rows read per window (in blocks of 16, a seeded systematic sample, as describe); "
        "0: every row.",
        min=0,
    )
    verify: int = option(
        0,
        "Causal check on the N heads with the largest top key share: remove the top key source from "
        "the head's key input only, against random sources of lower layers.",
        min=0,
    )
    controls: int = option(5, "Random lower-layer sources removed per verified head (--verify).", min=1)


def _check_langs(value: str) -> None:
    names = check_langs(value)
    if len(set(names)) != len(names):
        raise InputError(f"--lang {value}: a language is named twice")


def parse_heads(value: str | None) -> list[tuple[int, int]] | None:
    """``"L18H6,L17H8"`` -> ``[(18, 6), (17, 8)]`` (None: every head); refuses a malformed name."""
    names = split_names(value)
    if names is None:
        return None
    if not names:
        raise InputError("--heads is empty", hint="name heads like L18H6, or drop --heads")
    found = []
    for name in names:
        text = name.upper()
        if not (text.startswith("L") and "H" in text):
            raise InputError(f"--heads: {name!r} is not a head name", hint="write heads like L18H6")
        layer, _, head = text[1:].partition("H")
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        if not (layer.isascii() and layer.isdigit() and head.isascii() and head.isdigit()):
            raise InputError(f"--heads: {name!r} is not a head name", hint="write heads like L18H6")
        found.append((int(layer), int(head)))
    if len(set(found)) != len(found):
        raise InputError(f"--heads {value}: a head is named twice")
    return found


def check_heads(loaded: Any, value: str | None) -> None:
    """``--heads`` against the loaded model's layout: each head inside its layers and heads."""
    layout = loaded.layout
    for layer, head in parse_heads(value) or []:
        if not 0 <= layer < layout.n_layers:
            raise InputError(f"--heads: L{layer}H{head}: {loaded.name} has layers 0..{layout.n_layers - 1}")
        if not 0 <= head < layout.n_heads:
            raise InputError(f"--heads: L{layer}H{head}: {loaded.name} has heads 0..{layout.n_heads - 1}")


@dataclass
class QKInputs:
    heads: list[tuple[int, int]] | None
    fit_sources: list[Any]
    eval_sources: list[Any] | None
    eval_from: str


def _windows(
    loaded: Any, options: QKOptions, prepared: QKInputs
) -> tuple[list[Any], list[Any], str, tuple[int, int] | None]:
    """(fit, evaluation) windows as (ids, special) pairs, what the evaluation split is, and the
    query positions the protocol scores: on repeated random tokens, the later copies (each token
    there has an earlier occurrence to copy from); None on text (every row)."""
    n = options.windows
    if options.repeat_seq:
        spec = RepeatSpec(options.seq_len, options.repeat_seq, 2 * n, options.seed, None)
        sequences, specials, offset = repeated_tokens(loaded, spec)
        pairs = list(zip(sequences, specials, strict=True))
        what = f"repeated random tokens ({n} x {options.seq_len} tokens x {options.repeat_seq})"
        later = (offset + options.seq_len, offset + options.seq_len * options.repeat_seq)
        return pairs[:n], pairs[n:], what, later
    fit = balanced(windows(loaded, prepared.fit_sources, options.context), n)
    sources = prepared.eval_sources or shipped_sources("eval", split_names(options.lang) or ["en"])
    held = balanced(windows(loaded, sources, options.context), n)
    if len(held) < 2:
        raise InputError(
            f"{prepared.eval_from}: {len(held)} window of text to evaluate on; qk needs at least 2",
            hint="give a longer text, or a smaller --context",
        )
    return [(t.ids, t.special) for t in fit], [(t.ids, t.special) for t in held], prepared.eval_from, None


# --- the statistics of one split ---------------------------------------------------------------------------


@dataclass
class HeadSums:
    """One head's per-window sums over the rows read (float64): the margin, its split by key source
    and by query source, and (evaluation split) the reconstructions and the top pairs."""

    layer: int
    head: int
    group: int
    sources: list[Source]
    margin: list[float] = field(default_factory=list)
    key: list[np.ndarray] = field(default_factory=list)
    query: list[np.ndarray] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    rounding: list[float] = field(default_factory=list)  # the margin's rounding bound (_Waiting)
    value: list[np.ndarray] = field(default_factory=list)  # value side: each source's part of output
    output: list[float] = field(default_factory=list)  # sum_q |o(q)|^2, the value side's total
    choosing: list[int] = field(default_factory=list)  # rows read that see more than one key
    explained: list[np.ndarray] = field(default_factory=list)  # [len(RECONSTRUCT_K)] mean over rows
    pairs: np.ndarray | None = None  # [PAIRS, PAIRS] summed over windows
    top_key: list[int] = field(default_factory=list)
    top_query: list[int] = field(default_factory=list)
    example: dict[str, Any] | None = None  # evaluation split: one query's keys and their score split


@dataclass
class _Waiting:
    """One layer of one window, pulled back, waiting for the pass over the blocks' writes."""

    layer: int
    heads: list[int]
    prepared: list[Prepared]
    oracle: tuple[torch.Tensor, torch.Tensor] | None
    state: dict[str, Any]
    margin: torch.Tensor
    centred: torch.Tensor
    weights: torch.Tensor
    visible: torch.Tensor
    rows: torch.Tensor
    ids: list[int]
    rounding: torch.Tensor  # [h]: eps * sum over rows and keys of A|s|, the margin's rounding bound
    choosing: int  # rows read that see more than one key


# What the layers waiting for one pass over the blocks' writes may hold (their pull-backs and the
# evaluation split's writes); past it the pass runs. The pass rebuilds every block's writes below the
# deepest layer waiting, so each pass over L layers saves L - 1 rebuilds of them.
WAITING_BYTES = 256 << 20


def _within(prepared: list[Prepared], budget: int) -> list[list[Prepared]]:
    """``prepared`` in order, in runs whose held bytes stay within ``budget`` (one each at least):
    each run is one pass over the blocks' writes."""
    runs: list[list[Prepared]] = [[]]
    held = 0
    for p in prepared:
        if runs[-1] and held + p.nbytes > budget:
            runs.append([])
            held = 0
        runs[-1].append(p)
        held += p.nbytes
    return runs


class Split:
    """The reader of one split's pass: attention rows per layer, pulled back at each layer's end and
    decomposed a few layers at a time."""

    def __init__(
        self,
        loaded: Any,
        heads: dict[int, list[int]],
        sample: RowSample,
        recorder: SourceWrites,
        decomposers: dict[int, Decomposer],
        tops: dict[tuple[int, int], tuple[list[int], list[int]]] | None,
        detectors: list[Any],
        oracle: bool = False,
        value: bool = False,
        contrast: list[torch.Tensor] | None = None,
    ) -> None:
        self.loaded = loaded
        self.oracle = oracle  # every source projected (tests: the pull-back's oracle)
        self.value = value  # also the value side (headscope graph)
        # per window (by its index), key weights [T] that replace A - 1/n: the contrast of labelled
        # prompts (the answer's keys against the distractor's), read at the rows sampled
        self.contrast = contrast
        self.heads = heads
        self.sample = sample
        self.recorder = recorder
        self.decomposers = decomposers
        self.tops = tops
        self.detectors = detectors
        layout = loaded.layout
        group = layout.n_heads // layout.n_kv_heads
        self.sums = {
            (layer, h): HeadSums(layer, h, h // group, source_names(loaded, layer))
            for layer, hs in heads.items()
            for h in hs
        }
        if tops is not None:
            for key, (top_key, top_query) in tops.items():
                if key in self.sums:
                    self.sums[key].top_key, self.sums[key].top_query = top_key, top_query
        self.score_error = 0.0
        self.attention_error = 0.0
        self.advance: Any = None  # progress: one step per layer decomposed
        self._waiting: list[_Waiting] = []
        self._rows: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}

    def on_layer(self, layer: int, weights: torch.Tensor, batch: Any, q_start: int) -> None:
        for detector in self.detectors:
            detector.update(layer, weights, batch, q_start)
        if layer in self.heads:
            stop = q_start + weights.shape[2]
            visible = batch.visible(q_start, stop, weights.shape[3])
            self._rows.setdefault(layer, []).append((q_start, weights.detach().clone(), visible.clone()))

    def on_layer_done(self, layer: int, batch: Any) -> None:
        for detector in self.detectors:
            if hasattr(detector, "end_layer"):
                detector.end_layer(layer, batch)
        if layer not in self.heads:
            return
        chunks = self._rows.pop(layer, [])
        read = self.sample(batch)
        last = layer == max(self.heads)
        for row in range(batch.input_ids.shape[0]):
            length = int(batch.attention_mask[row].sum())
            ids = batch.input_ids[row, :length].tolist()
            recording = self.recorder.current(row)
            window = int(batch.example_index[row])
            self._decompose(layer, recording, chunks, read[row, :length], row, length, ids, window)
            held = sum(p.nbytes for w in self._waiting for p in w.prepared)
            # a window's layers wait for one another (batches of one window), never across rows
            if last or held > WAITING_BYTES or batch.input_ids.shape[0] > 1:
                self._flush(recording)
        if self.advance is not None:
            self.advance(batch.input_ids.shape[0])

    def _gather(
        self, chunks: list[Any], read: torch.Tensor, row: int, length: int, n_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, weights, visible = [], [], []
        for q_start, w, v in chunks:
            for offset in range(w.shape[2]):
                position = q_start + offset
                if position < length and bool(read[position]):
                    rows.append(position)
                    keys = min(w.shape[3], length)
                    full_w = torch.zeros(n_heads, length, dtype=torch.float64)
                    full_w[:, :keys] = w[row, :, offset, :keys].double()
                    full_v = torch.zeros(length, dtype=torch.bool)
                    full_v[:keys] = v[row, offset, :keys].bool()
                    weights.append(full_w)
                    visible.append(full_v)
        if not rows:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, torch.zeros(n_heads, 0, length), torch.zeros(0, length, dtype=torch.bool)
        return torch.tensor(rows), torch.stack(weights, 1), torch.stack(visible)

    def _decompose(
        self,
        layer: int,
        recording: Any,
        chunks: list[Any],
        read: torch.Tensor,
        row: int,
        length: int,
        ids: list[int],
        window: int = 0,
    ) -> None:
        layout = self.loaded.layout
        rows, weights, visible = self._gather(chunks, read, row, length, layout.n_heads)
        if len(rows) == 0:
            return
        heads = self.heads[layer]
        group = layout.n_heads // layout.n_kv_heads
        groups = torch.tensor([h // group for h in heads])
        chosen = torch.tensor(heads)
        decomposer = self.decomposers[layer]
        n_vis = visible.sum(-1, keepdim=True).clamp(min=1).double()
        centred = weights[chosen] - visible.double()[None] / n_vis[None]  # [h, R, T]
        if self.contrast is not None:  # the answer's keys against the distractor's, at each row
            keys = self.contrast[window][:length].double()
            centred = (keys[None, None, :] * visible.double()[None]).expand(len(chosen), -1, -1).clone()
        parts = decomposer.actual(recording, rows)
        query = parts.query[chosen]  # [h, R, d]
        key = parts.key[groups]  # [h, T, d]
        scaling = parts.scaling
        self._check_attention(query, key, scaling, weights[chosen], visible)
        kbar = torch.einsum("hrt,htd->hrd", centred, key)
        margin = (scaling * (query * kbar).sum(-1)).sum(-1)  # [h]
        # The attention weights are the model's (float32 or lower), rounded each to eps of itself:
        # the margin is known only to about eps * sum A|s| (the scores' offset included).
        eps = torch.finfo(chunks[0][1].dtype).eps
        scores = (scaling * query @ key.transpose(1, 2)).abs().masked_fill(~visible[None], 0.0)
        # a contrast's weights are exact; its scores are rounded at eps of themselves
        rounding = eps * ((weights[chosen] if self.contrast is None else centred.abs()) * scores).sum((1, 2))
        choosing = int((visible.sum(-1) > 1).sum())
        tops = None
        if self.tops is not None:
            tops = [(self.sums[(layer, h)].top_key, self.sums[(layer, h)].top_query) for h in heads]
        prepared = decomposer.prepare(
            recording,
            parts,
            heads,
            centred,
            tops,
            cuts=RECONSTRUCT_K,
            individual=PAIRS,
            attention=weights[chosen] if self.value else None,
        )
        oracle = None
        if self.oracle:
            oracle = self._projected(decomposer, recording, rows, chosen, groups, centred, query, kbar)
        state: dict[str, Any] = {"query": query, "key": key, "kbar": kbar, "scaling": scaling}
        self._waiting.append(
            _Waiting(
                layer,
                heads,
                prepared,
                oracle,
                state,
                margin,
                centred,
                weights,
                visible,
                rows,
                ids,
                rounding,
                choosing,
            )  # fmt: skip
        )

    def _flush(self, recording: Any) -> None:
        """The pass over the blocks' writes for every layer waiting (one pass, where the model's
        writes do not depend on the layer they enter), then each head's sums."""
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        prepared = [p for w in waiting for p in w.prepared]
        results = []
        for batch in _within(prepared, WAITING_BYTES):
            deepest = max(batch, key=lambda p: p.decomposer.layer).decomposer
            if deepest.shares_writes:
                results += deepest.flush(recording, batch)
            else:
                results += [found for p in batch for found in p.decomposer.flush(recording, [p])]
        at = 0
        for w in waiting:
            chunks = results[at : at + len(w.prepared)]
            at += len(w.prepared)
            found = WindowParts(
                torch.cat([c.key for c in chunks]),
                torch.cat([c.query for c in chunks]),
                torch.cat([c.margin for c in chunks]),
                [h for c in chunks for h in c.heads],
            )
            if self.value:
                found.value = torch.cat([c.value for c in chunks if c.value is not None])
                found.output = torch.cat([c.output for c in chunks if c.output is not None])
                self._check_value(w.layer, found.value, found.output)
            self._record(w, found)

    def _record(self, w: _Waiting, found: WindowParts) -> None:
        if w.oracle is not None:
            key_num, query_num = w.oracle
        else:
            key_num, query_num = found.key, found.query
            self._check_sum(w.layer, key_num, query_num, w.margin)
        for i, h in enumerate(w.heads):
            sums = self.sums[(w.layer, h)]
            sums.margin.append(float(w.margin[i]))
            sums.key.append(key_num[i].numpy())
            sums.query.append(query_num[i].numpy())
            sums.rows.append(len(w.rows))
            sums.rounding.append(float(w.rounding[i]))
            sums.choosing.append(w.choosing)
            if found.value is not None and found.output is not None:
                sums.value.append(found.value[i].numpy())
                sums.output.append(float(found.output[i]))
            if self.tops is not None:
                self._evaluate(sums, i, w.state, found.heads[i], w.centred[i], w.weights[h], w.visible)
                self._example(sums, i, w.state, found.heads[i], w.weights[h], w.visible, w.rows, w.ids)

    def _projected(
        self,
        decomposer: Decomposer,
        recording: Any,
        rows: torch.Tensor,
        chosen: torch.Tensor,
        groups: torch.Tensor,
        centred: torch.Tensor,
        query: torch.Tensor,
        kbar: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The oracle of :meth:`Decomposer.numerators` (tests): every source projected through the
        queries and keys, and its parts' sums checked against the actual queries and keys."""
        key_num = query_num = q_total = k_total = None
        parts = None
        for parts, indices, q, k, _, _ in decomposer.decompose(recording, rows):
            if key_num is None:
                count = len(parts.sources)
                key_num = torch.zeros(len(chosen), count, dtype=torch.float64)
                query_num = torch.zeros_like(key_num)
                q_total, k_total = torch.zeros_like(parts.query), torch.zeros_like(parts.key)
            q_total = q_total + q.sum(0)
            k_total = k_total + k.sum(0)
            kbar_c = torch.einsum("hrt,chtd->chrd", centred, k[:, groups])
            index = torch.tensor(indices)
            key_num[:, index] = (parts.scaling * (query[None] * kbar_c).sum(-1)).sum(-1).T
            query_num[:, index] = (parts.scaling * (q[:, chosen] * kbar[None]).sum(-1)).sum(-1).T
        assert parts is not None and key_num is not None and query_num is not None
        error = max(
            float((q_total - parts.query).abs().max() / parts.query.abs().max().clamp(min=1e-30)),
            float((k_total - parts.key).abs().max() / parts.key.abs().max().clamp(min=1e-30)),
        )
        self.score_error = max(self.score_error, error)
        return key_num, query_num

    def _example(
        self,
        sums: HeadSums,
        i: int,
        state: dict[str, Any],
        parts_of: HeadTops,
        actual: torch.Tensor,
        visible: torch.Tensor,
        rows: torch.Tensor,
        ids: list[int],
    ) -> None:
        """The query with the largest margin so far, its most-attended keys and their scores split by
        the head's top key sources (the rest summed): what the card draws."""
        scaling = state["scaling"]
        margins = scaling * (state["query"][i] * state["kbar"][i]).sum(-1)  # [R]
        best = int(margins.argmax())
        if sums.example is not None and sums.example["margin"] >= float(margins[best]):
            return
        query = state["query"][i][best]
        weights = actual[best]
        keys = [int(k) for k in weights.argsort(descending=True)[:EXAMPLE_KEYS] if weights[k] > 0]
        tops = [s for s in sums.top_key[:EXAMPLE_SOURCES]]
        tokenizer = self.loaded.tokenizer
        listed = []
        for key in keys:
            score = float(scaling * (query * state["key"][i][key]).sum())
            parts = {
                sums.sources[s].name: float(scaling * (query * parts_of.key[s][key]).sum()) for s in tops
            }
            listed.append(
                {
                    "position": key,
                    "token": tokenizer.decode([ids[key]]),
                    "attention": float(weights[key]),
                    "score": score,
                    "parts": parts,
                    "rest": score - sum(parts.values()),
                }
            )
        position = int(rows[best])
        sums.example = {
            "query": position,
            "token": tokenizer.decode([ids[position]]),
            "margin": float(margins[best]),
            "mean_score": float(scaling * (query * state["key"][i][visible[best]]).sum(-1).mean()),
            "keys": listed,
        }

    def _evaluate(
        self,
        sums: HeadSums,
        i: int,
        state: dict[str, Any],
        tops: HeadTops,
        centred: torch.Tensor,
        actual: torch.Tensor,
        visible: torch.Tensor,
    ) -> None:
        scaling = state["scaling"]
        assert tops.query_all is not None and tops.key_all is not None
        base_q = state["query"][i] - tops.query_all  # every source at its mean
        base_k = state["key"][i] - tops.key_all
        explained = []
        for k in RECONSTRUCT_K:
            q, kk = base_q, base_k
            q_move, k_move = tops.moved("query", k), tops.moved("key", k)
            if q_move is not None:
                q = q + q_move
            if k_move is not None:
                kk = kk + k_move
            scores = (scaling * q @ kk.T).masked_fill(~visible, float("-inf"))
            predicted = torch.softmax(scores, -1)
            explained.append(float(torch.minimum(actual, predicted).sum(-1).mean()))
        sums.explained.append(np.array(explained))
        top_q, top_k = sums.top_query[:PAIRS], sums.top_key[:PAIRS]
        pairs = np.zeros((PAIRS, PAIRS))
        kbar = {kb: centred @ tops.key[kb] for kb in top_k}
        for a, qa in enumerate(top_q):
            for b, kb in enumerate(top_k):
                pairs[a, b] = float(scaling * (tops.query[qa] * kbar[kb]).sum())
        sums.pairs = pairs if sums.pairs is None else sums.pairs + pairs

    def _check_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        scaling: float,
        actual: torch.Tensor,
        visible: torch.Tensor,
    ) -> None:
        scores = (scaling * query @ key.transpose(1, 2)).masked_fill(~visible[None], float("-inf"))
        error = float((torch.softmax(scores, -1) - actual).abs().max())
        self.attention_error = max(self.attention_error, error)
        if error > capture.checks.tolerance(self.loaded):
            raise Unsupported(
                f"qk: {self.loaded.name}: the attention module's own queries and keys, taken through "
                f"softmax(q·k × scaling), do not give the model's attention (error {error:.1e}): "
                "something besides q·k enters the scores (a position bias, sinks, soft-capping)",
                hint="report the family to headscope",
            )

    def _check_value(self, layer: int, value_num: torch.Tensor, output: torch.Tensor) -> None:
        # The value parts are linear in the sources (frozen norm): they sum to sum_q |o(q)|^2.
        scale = torch.maximum(value_num.abs().sum(-1), output.abs()).clamp(min=1e-300)
        error = float(((value_num.sum(-1) - output).abs() / scale).max())
        self.score_error = max(self.score_error, error)
        if error > SCORE_TOLERANCE:
            raise Unsupported(
                f"qk: {self.loaded.name} layer {layer}: the sources' value parts sum to the heads' "
                f"outputs only to {error:.1e} relative (needs {SCORE_TOLERANCE:g})",
                hint="report the family to headscope",
            )

    def _check_sum(
        self, layer: int, key_num: torch.Tensor, query_num: torch.Tensor, margin: torch.Tensor
    ) -> None:
        # The parts are linear in the sources (frozen norms): on each side they sum to the margin.
        # Relative to the largest of the parts and the margin.
        error = 0.0
        for num in (key_num, query_num):
            scale = torch.maximum(num.abs().sum(-1), margin.abs()).clamp(min=1e-300)
            error = max(error, float(((num.sum(-1) - margin).abs() / scale).max()))
        self.score_error = max(self.score_error, error)
        if error > SCORE_TOLERANCE:
            raise Unsupported(
                f"qk: {self.loaded.name} layer {layer}: the sources' parts sum to the heads' margins "
                f"only to {error:.1e} relative (needs {SCORE_TOLERANCE:g})",
                hint="report the family to headscope",
            )


def _run_split(
    loaded: Any,
    pairs: list[Any],
    heads: dict[int, list[int]],
    decomposers: dict[int, Decomposer],
    sample: RowSample,
    tops: Any,
    detectors: list[Any],
    progress: Any,
    label: str,
    oracle: bool = False,
    value: bool = False,
    contrast: list[torch.Tensor] | None = None,
) -> Split:
    recorder = SourceWrites(loaded, list(heads))
    split = Split(loaded, heads, sample, recorder, decomposers, tops, detectors, oracle, value, contrast)
    for detector in detectors:
        detector.start(loaded.layout, len(pairs))
    batches = model_batches(loaded, [p[0] for p in pairs], [p[1] for p in pairs], 1)
    stop = recorder.last if loaded.capture_mode == "stream" else None
    # By layer decomposed, window by window: a deep model's window is minutes, and the bar's time
    # left is only as good as its steps are even.
    if progress is not None:
        split.advance = progress(
            f"{label} ({len(batches)} windows x {len(heads)} layers)", len(batches) * len(heads)
        )
    spec = Pass(
        reads=[recorder, Attention(split.on_layer, rows=sample, on_layer_done=split.on_layer_done)],
        stop_after=stop,
    )
    capture.run(loaded, batches, spec)
    return split


# --- from sums to shares -----------------------------------------------------------------------------------


def _shares(
    sums: HeadSums, side: str, n_resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each source's share of the side's total (the margin; the value side: sum_q |o(q)|^2), the
    ratio of sums over windows, with its bootstrap interval over windows."""
    num = torch.tensor(np.stack(getattr(sums, side)))  # [W, S]
    den = torch.tensor(sums.output if side == "value" else sums.margin)
    # a contrast may be negative (a total that is not resolved never gets here: _unresolved): its
    # shares are the same of -num / -den, and the bootstrap reads positive totals
    if float(den.sum()) < 0:
        num, den = -num, -den
    total = float(den.sum())
    share = num.sum(0).numpy() / (total if total != 0 else math.nan)
    low, high, _ = bootstrap_ratio(num, den, n_resamples=n_resamples, seed=seed)
    return share, low, high


def _tops(split: Split) -> dict[tuple[int, int], tuple[list[int], list[int]]]:
    """Each head's sources ranked by share on the fit split, key side and query side."""
    found = {}
    for key, sums in split.sums.items():
        ranked = []
        for side in SIDES:
            share, _, _ = _shares(sums, side, 0, 0)
            ranked.append([int(i) for i in np.argsort(-share)[: max(RECONSTRUCT_K[-1], PAIRS)]])
        found[key] = (ranked[0], ranked[1])
    return found


@dataclass
class QKResult:
    """What qk found: per head, its sides' shares and the rest (the JSON's ``qk`` block)."""

    heads: list[dict[str, Any]]
    data: str
    windows: dict[str, int]
    rows_per_window: int | None
    check: dict[str, float]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "data": self.data,
            "windows": self.windows,
            "rows_per_window": self.rows_per_window,
            "reconstruct_k": list(RECONSTRUCT_K),
            "check": self.check,
            "heads": self.heads,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "qk block") -> QKResult:
        """Read back a saved ``qk`` block, checked against its schema and invariants
        (:func:`headscope.analyses.qk_block.check_qk_block`): a damaged block is refused in one line
        naming ``source`` and the JSON path."""
        check_qk_block(data, source)
        return cls(
            data["heads"],
            data.get("data", ""),
            data.get("windows", {}),
            data.get("rows_per_window"),
            data.get("check", {}),
        )

    def head(self, layer: int, head: int) -> dict[str, Any]:
        for entry in self.heads:
            if entry["layer"] == layer and entry["head"] == head:
                return entry
        raise KeyError(f"L{layer}H{head}")


def _nan(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _unresolved(sums: HeadSums, signed: bool = False) -> str | None:
    """Why the head's margin cannot be split (None where it can): no row chose between keys, or the
    margin is within :data:`RESOLVE` times its rounding bound (a share would be a ratio of noise).
    ``signed``: a contrast (it may be negative; its size is what must clear the bound)."""
    n_rows = max(1, int(np.sum(sums.rows)))
    if not np.sum(sums.choosing):
        return "no query row read sees more than one key, so the head makes no choice to split"
    margin, resolution = float(np.sum(sums.margin)), RESOLVE * float(np.sum(sums.rounding))
    if (abs(margin) if signed else margin) > resolution:
        return None
    if signed:
        return (
            f"its contrast ({margin / n_rows:.2g} per prompt) is within {RESOLVE}x its float rounding "
            f"({resolution / n_rows:.2g}): it does not measurably prefer the answer or the distractor"
        )
    if resolution == 0:
        return (
            "its scores are 0 at every key it attends to (its queries or keys carry no signal), so "
            "it makes no choice to split"
        )
    return (
        f"its margin ({margin / n_rows:.2g} per row) is not above {RESOLVE}x its float rounding "
        f"({resolution / n_rows:.2g}): its attention does not measurably prefer any key, so no "
        "share is reported"
    )


def _summarise(
    evaluation: Split,
    roles: dict[tuple[int, int], str],
    composition: dict[tuple[int, int], dict[tuple[int, int], tuple[float, float]]],
    n_resamples: int,
    seed: int,
) -> list[dict[str, Any]]:
    out = []
    for (layer, head), sums in sorted(evaluation.sums.items()):
        if not sums.margin:
            continue
        n_rows = max(1, int(np.sum(sums.rows)))
        unresolved = _unresolved(sums, signed=evaluation.contrast is not None)
        entry: dict[str, Any] = {
            "layer": layer,
            "head": head,
            "kv_group": sums.group,
            "role": roles.get((layer, head), ""),
            "margin": float(np.sum(sums.margin) / n_rows),
            "resolution": float(RESOLVE * np.sum(sums.rounding) / n_rows),
            "unresolved": unresolved,
            "windows": len(sums.margin),
        }
        comp = composition.get((layer, head), {})
        sides = SIDES
        if sums.value:  # the value side: its own total, resolved where the head writes anything
            sides = (*SIDES, "value")
            entry["output"] = float(np.sum(sums.output) / n_rows)
            entry["value_unresolved"] = (
                None
                if np.sum(sums.output) > 0
                else "the head writes nothing at the rows read (its output is 0), so no share"
            )
        for side in sides:
            blocked = entry["value_unresolved"] if side == "value" else unresolved
            if blocked is None:
                share, low, high = _shares(sums, side, n_resamples, seed)
                order = np.argsort(-np.abs(share))
            else:  # no share: the sources in their own order
                share = low = high = np.full(len(sums.sources), np.nan)
                order = np.arange(len(sums.sources))
            listed = []
            for i in order:
                source = sums.sources[int(i)]
                weights = comp.get((source.layer, source.head)) if source.kind == "head" else None
                listed.append(
                    {
                        "source": source.name,
                        "kind": source.kind,
                        "role": roles.get((source.layer, source.head), "") if source.kind == "head" else "",
                        "share": _nan(float(share[i])),
                        "ci_low": _nan(low[i]),
                        "ci_high": _nan(high[i]),
                        "composition": None
                        if weights is None or side == "value"
                        else float(weights[1 if side == "key" else 0]),
                    }
                )
            entry[side] = listed
        entry["top_fit"] = {
            "key": [sums.sources[i].name for i in sums.top_key[:PAIRS]],
            "query": [sums.sources[i].name for i in sums.top_query[:PAIRS]],
        }
        if unresolved is not None:  # the pairs and the reconstruction are fractions of the margin too
            if sums.example is not None:
                entry["example"] = sums.example
            out.append(entry)
            continue
        total = float(np.sum(sums.margin))
        if sums.pairs is not None and total > 0:
            pairs = [
                {
                    "query": sums.sources[a].name,
                    "key": sums.sources[b].name,
                    "share": float(sums.pairs[i, j] / total),
                }
                for i, a in enumerate(sums.top_query[:PAIRS])
                for j, b in enumerate(sums.top_key[:PAIRS])
            ]
            entry["pairs"] = sorted(pairs, key=lambda p: -abs(p["share"]))[:PAIRS]
        if sums.example is not None:
            entry["example"] = sums.example
        if sums.explained:
            values = torch.tensor(np.stack(sums.explained))  # [W, K]
            ones = torch.ones(values.shape[0], dtype=torch.float64)
            low, high, _ = bootstrap_ratio(values, ones, n_resamples=n_resamples, seed=seed)
            mean = values.mean(0).numpy()
            entry["reconstructed"] = [
                {"k": k, "explained": float(mean[i]), "ci_low": _nan(low[i]), "ci_high": _nan(high[i])}
                for i, k in enumerate(RECONSTRUCT_K)
            ]
        out.append(entry)
    return out


SOURCE_COLUMNS = [
    "model",
    "layer",
    "head",
    "kv_group",
    "side",
    "source",
    "kind",
    "role",
    "share",
    "ci_low",
    "ci_high",
    "n",
    "rank",
    "composition",
    "note",
]


def sources_table(model: str, heads: list[dict[str, Any]], listed: int | None = None) -> pd.DataFrame:
    """One row per (head, side, source): the source's kind and role (from this run's detectors),
    its share with its interval, ``n`` evaluation windows, its rank on that side, and the
    weight-only composition score (K- on the key side, Q- on the query side; heads only), and the
    ``note``: why the head has no shares, where its margin is not resolved (its shares are empty).
    With ``listed``, the largest ``listed`` by |share| per (head, side) and one ``rest`` row summing
    the others, so a head's rows on a side still sum to 1."""
    records = []
    for entry in heads:
        head = {
            "model": model,
            "layer": entry["layer"],
            "head": entry["head"],
            "kv_group": entry["kv_group"],
            "n": entry["windows"],
            "note": entry.get("unresolved") or "",
        }
        for side in SIDES:
            rows = entry[side]
            shown = rows if listed is None else rows[:listed]
            for rank, item in enumerate(shown, start=1):
                fields = ("source", "kind", "role", "share", "ci_low", "ci_high", "composition")
                records.append({**head, "side": side, "rank": rank, **{k: item[k] for k in fields}})
            rest = rows[len(shown) :]
            if rest:
                values = [item["share"] for item in rest]
                share = None if None in values else float(sum(values))
                records.append(
                    {**head, "side": side, "source": "rest", "kind": "rest", "role": "", "share": share}
                )
    return pd.DataFrame.from_records(records, columns=SOURCE_COLUMNS)


def tidy_rows(model: str, heads: list[dict[str, Any]], listed: int = LISTED) -> pd.DataFrame:
    """The report's table in the project's CSV columns (``--csv``): ``detector`` qk, ``relation``
    the side, ``direction`` the source, ``score`` its share, ``baseline`` the composition score,
    ``rank`` its rank on that side; ``role`` stays empty (the column is the row's head's role, and qk
    assigns none; the sources' roles are in ``--sources`` and the JSON)."""
    sources = sources_table(model, heads, listed)
    table = pd.DataFrame(
        {
            "model": sources["model"],
            "detector": "qk",
            "relation": sources["side"],
            "direction": sources["source"],
            "layer": sources["layer"],
            "head": sources["head"],
            "kv_group": sources["kv_group"],
            "score": sources["share"],
            "baseline": sources["composition"],
            "ci_low": sources["ci_low"],
            "ci_high": sources["ci_high"],
            "n": sources["n"],
            "rank": sources["rank"],
            "role": "",
            "data": "qk",
        },
        columns=CSV_COLUMNS,
    )
    for column in [*HIDDEN_COLUMNS, "p_adj", "strength"]:
        table[column] = np.nan
    return table


def write_sources(result: Any, path: Path, force: bool) -> str:
    """``--sources``: every (head, side, source) row, as :func:`sources_table`."""
    from headscope import files

    found = result.qk
    text = sources_table(result.model, found.heads).to_csv(index=False)
    return str(files.write_atomic(path, text, "--sources", force))


def _roles(loaded: Any, detectors: list[Any], n_resamples: int, seed: int) -> dict[tuple[int, int], str]:
    if not detectors:
        return {}
    results = [r for d in detectors for r in d.results("qk-eval")]
    table = assign_roles(head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed))
    if not len(table):
        return {}
    # The role's detector names it ("previous-token"), where the role map's label is short ("prev").
    return {(int(r.layer), int(r.head)): str(r.detector) for r in head_roles(table).itertuples() if r.role}


def _composition(loaded: Any, heads: list[tuple[int, int]]) -> tuple[dict[Any, Any], str | None]:
    try:
        from headscope.weightroles.composition import composition_scores
    except ImportError:  # pragma: no cover - the module ships with headscope
        return {}, "weight-only composition scores are not available"
    try:
        return composition_scores(loaded, heads), None
    except HeadscopeError as exc:  # a layout the weights cannot be read from: said in a note
        return {}, f"weight-only composition scores: {exc}"


def qk(
    loaded: Any,
    options: QKOptions,
    prepared: QKInputs,
    progress: Any = None,
) -> tuple[Report, QKResult, dict[str, Any]]:
    """Decompose the chosen heads' attention over their sources; see the module docstring."""
    fit_pairs, eval_pairs, data, later = _windows(loaded, options, prepared)
    result, state = explain(
        loaded,
        fit_pairs,
        eval_pairs,
        data,
        prepared.heads,
        rows=options.rows or None,
        seed=options.seed,
        n_resamples=options.resamples,
        repeated=bool(options.repeat_seq),
        progress=progress,
    )
    report = Report(
        loaded.name,
        tidy_rows(loaded.name, result.heads),
        [],
        loaded.capture_mode,
        notes=list(result.notes),
        layout=loaded.layout,
    )
    return report, result, {**state, "verify_rows": later}


def explain(
    loaded: Any,
    fit_pairs: list[Any],
    eval_pairs: list[Any],
    data: str,
    chosen: list[tuple[int, int]] | None = None,
    *,
    rows: int | None = 64,
    seed: int = 0,
    n_resamples: int = 1000,
    repeated: bool = False,
    progress: Any = None,
    oracle: bool = False,
    value: bool = False,
    contrast: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    sample: Any = None,
) -> tuple[QKResult, dict[str, Any]]:
    """The decomposition of ``chosen`` heads (None: every head) on windows given as (ids, special)
    pairs: ``fit_pairs`` rank each head's sources, ``eval_pairs`` measure everything reported
    (``describe --why`` calls this with its own windows). ``repeated``: the windows are repeated
    random tokens (the detectors that name the sources' roles include induction). ``value``: each
    head's value side too, on the evaluation split (``headscope graph``). ``contrast``: per fit and
    evaluation window, key weights ``[T]`` that replace each row's ``A - 1/n`` (labelled prompts: the
    answer's keys against the distractor's), read at the rows of ``sample`` (a reader of the rows,
    the same for both splits; default: ``rows`` sampled as describe does)."""
    layout = loaded.layout
    chosen = chosen or [(layer, h) for layer in range(layout.n_layers) for h in range(layout.n_heads)]
    heads: dict[int, list[int]] = {}
    for layer, h in chosen:
        heads.setdefault(layer, []).append(h)
    heads = {layer: sorted(hs) for layer, hs in sorted(heads.items())}
    _check_memory(loaded, max(len(p[0]) for p in fit_pairs + eval_pairs), max(heads))
    shared: dict[int, Any] = {}  # W_O of each layer, one copy for every layer's decomposer
    decomposers = {layer: Decomposer(loaded, layer, shared) for layer in heads}
    fit = _run_split(
        loaded,
        fit_pairs,
        heads,
        decomposers,
        RowSample(rows, seed, 0) if sample is None else sample,
        None,
        [],
        progress,
        "qk: fit",
        oracle,
        contrast=None if contrast is None else contrast[0],
    )
    tops = _tops(fit)
    if contrast is not None:  # roles found on a dozen tokens' final row would mean nothing
        detectors = []
    elif repeated:
        detectors = create_detectors(["previous-token", "duplicate-token", "induction", "sink"])
    else:
        detectors = detectors_for("text", None)
    given = sample
    sample = RowSample(rows, seed, 1) if given is None else given
    evaluation = _run_split(
        loaded,
        eval_pairs,
        heads,
        decomposers,
        sample,
        tops,
        detectors,
        progress,
        "qk: evaluate",
        oracle,
        value,
        None if contrast is None else contrast[1],
    )
    roles = _roles(loaded, detectors, n_resamples, seed)
    composition, note = _composition(loaded, chosen)
    summary = _summarise(evaluation, roles, composition, n_resamples, seed)
    notes = [note] if note else []
    unresolved = [e for e in summary if e["unresolved"]]
    if unresolved:
        names = ", ".join(f"L{e['layer']}H{e['head']}" for e in unresolved[:8])
        more = f" and {len(unresolved) - 8} more" if len(unresolved) > 8 else ""
        notes.append(
            f"{len(unresolved)} heads without shares ({names}{more}): their margin is not resolved "
            f"against float rounding ({RESOLVE}x eps x sum A|s|); each head's reason is in the JSON's "
            "unresolved and the --sources CSV's note"
        )
    if len(eval_pairs) < MIN_EXAMPLES:
        notes.append(
            f"{len(eval_pairs)} evaluation windows < {MIN_EXAMPLES}: shares without intervals "
            "(raise --windows)"
        )
    result = QKResult(
        summary,
        data,
        {"fit": len(fit_pairs), "eval": len(eval_pairs)},
        rows,
        {
            "score_error": max(fit.score_error, evaluation.score_error),
            "attention_error": max(fit.attention_error, evaluation.attention_error),
            "score_tolerance": SCORE_TOLERANCE,
        },
        notes,
    )
    return result, {"eval_pairs": eval_pairs, "sample": sample, "decomposers": decomposers}


def _check_memory(loaded: Any, length: int, last: int) -> None:
    """Refuse a window whose decomposition would not fit, before any pass. A pre-norm model's pass
    records every block's input, heads' outputs and attention input up to ``last`` (float32) and
    works within fixed budgets beyond them (the pull-backs, one block's writes, the layers waiting for
    a pass); a post-norm model (BERT and kin) builds every source's write at the layer's input
    (float64)."""
    from headscope.capture import sources

    d_model = loaded.layout.d_model
    blocks = anatomy.blocks(loaded.model)
    if all(sources.post_block_norms(block) is None for block in blocks):
        needed = 3 * (last + 1) * length * d_model * 4
        what = f"qk: recording {last + 1} blocks x {length} tokens x d_model {d_model} (3 tensors each)"
    else:
        count = len(source_names(loaded, last))
        needed = count * length * d_model * 8
        what = f"qk: {count} sources x {length} tokens x d_model {d_model}"
    if needed > sources.MAX_SOURCE_BYTES:
        raise InputError(
            f"{what} would need {needed / 2**30:.1f} GiB for layer {last}",
            hint="lower --context, or restrict --heads to shallower layers",
        )


# --- the causal check ----------------------------------------------------------------------------------------


@dataclass
class KeyRemoval:
    """One verified head: its attention's move when its top key source leaves its key input, and
    when random lower-layer sources do."""

    layer: int
    head: int
    source: str
    share: float
    move: float
    controls: list[str]
    control_move: float
    ratio: float | None  # None where the random sources' move is within float rounding
    ci_low: float | None
    ci_high: float | None
    windows: int
    rows: str = "every query row read"  # the query rows the moves average over
    rows_read: int = 0  # how many, over the evaluation windows
    note: str = ""  # why the ratio is None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class KeyRemovals:
    heads: list[KeyRemoval]
    skipped: list[str] = field(default_factory=list)  # heads asked for but not verified, and why

    def to_json(self) -> dict[str, Any]:
        return {"heads": [h.to_json() for h in self.heads], "skipped": list(self.skipped)}

    def print_to(self, console: Any, top: int) -> None:
        from .qk_present import print_removals

        print_removals(self, console)


def verify_heads(
    loaded: Any,
    result: QKResult,
    state: dict[str, Any],
    n: int,
    controls: int,
    seed: int,
    n_resamples: int,
    progress: Any = None,
) -> KeyRemovals:
    """Remove each of the ``n`` heads' top key source from its key input only (:class:`KeyOnly`),
    on the evaluation windows, against ``controls`` random sources of lower layers (heads and MLPs).
    The moves average over the sampled query rows the protocol scores (``state["verify_rows"]``:
    on repeated random tokens the later copies, as the induction score reads them; else every row).

    Layer 0's heads read only the embedding (no lower source to remove): ``n`` beyond the heads above
    it is refused before any pass. A head without shares (its margin not resolved) has no top source:
    it is skipped and named in ``skipped``."""
    above = [e for e in result.heads if e["layer"] > 0]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"verify: k={n!r} must be a whole number of heads, at least 1")
    if n > len(above):
        raise InputError(
            f"verify: {n} heads asked for, but only {len(above)} of the {len(result.heads)} heads explained "
            "lie above layer 0 (layer 0's heads read only the embedding: no lower source to remove)",
            hint=f"ask for at most {len(above)} (k=, --verify), or explain heads of later layers",
        )
    candidates = [e for e in above if not e.get("unresolved")]
    candidates.sort(key=lambda e: -e["key"][0]["share"])
    rng = np.random.default_rng(seed)
    chosen = candidates[:n]
    skipped = [
        f"L{e['layer']}H{e['head']}: no top source to remove ({e['unresolved']})"
        for e in above
        if e.get("unresolved")
    ][: max(0, n - len(chosen))]
    advance = progress("qk: verify", len(chosen)) if progress is not None else None
    found = []
    for entry in chosen:
        found.append(_verify_head(loaded, entry, state, controls, rng, seed, n_resamples))
        if advance is not None:
            advance(1)
    return KeyRemovals(found, skipped)


def _attention_rows(
    loaded: Any, batches: list[Any], layer: int, head: int, sample: RowSample, **extra: Any
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One pass: head ``head``'s attention rows at ``layer`` per window (the sampled rows), with
    their query positions."""
    store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(at: int, weights: torch.Tensor, batch: Any, q_start: int) -> None:
        if at == layer:
            _keep_rows(store, weights, batch, q_start, head, sample)

    reads = [Attention(keep, rows=sample), *extra.pop("reads", [])]
    stop = layer if loaded.capture_mode == "stream" else None
    capture.run(loaded, batches, Pass(reads=reads, stop_after=stop, **extra))
    return store


def _verify_head(
    loaded: Any,
    entry: dict[str, Any],
    state: dict[str, Any],
    controls: int,
    rng: np.random.Generator,
    seed: int,
    n_resamples: int,
) -> KeyRemoval:
    layer, head = entry["layer"], entry["head"]
    pairs = state["eval_pairs"]
    sample: RowSample = state["sample"]
    decomposer: Decomposer = state["decomposers"][layer]
    names = [s.name for s in decomposer.sources]
    top = entry["key"][0]["source"]
    pool = [s.name for s in decomposer.sources if s.kind in ("head", "mlp") and s.name != top]
    picked = [str(x) for x in rng.choice(pool, size=min(controls, len(pool)), replace=False)]
    wanted = [names.index(top), *(names.index(c) for c in picked)]
    batches = model_batches(loaded, [p[0] for p in pairs], [p[1] for p in pairs], 1)
    writes: dict[int, dict[int, torch.Tensor]] = {}
    recorder = SourceWrites(loaded, [layer])

    def record(batch: Any) -> None:
        every, bias = decomposer.writes(recorder.recorded[0])
        every = [*every, bias]  # the sources in source_names' order: bias last
        writes[int(batch.example_index[0])] = {i: every[i].float() for i in wanted}

    clean = _attention_rows(loaded, batches, layer, head, sample, reads=[recorder], on_batch_done=record)
    span = state.get("verify_rows")
    kept = {w: _in_span(positions, span) for w, (_, positions) in clean.items()}
    windows = sorted(w for w in clean if kept[w].any())
    if not windows:
        raise InputError(
            f"--verify: no sampled query row of L{layer}H{head} falls in the later copies",
            hint="raise --rows (0: every row), or --seq-len",
        )
    moves = []
    for index in wanted:

        def removed(batch: Any, index: int = index) -> torch.Tensor:
            return writes[int(batch.example_index[0])][index][None]

        edited = _attention_rows(loaded, batches, layer, head, sample, edits=[KeyOnly(layer, removed)])
        # total variation: never negative (1 - sum min(A, A') is the same where both rows sum to 1,
        # and goes below 0 by the rows' rounding where nothing moves)
        moves.append(
            [float((0.5 * (clean[w][0] - edited[w][0]).abs().sum(-1))[kept[w]].mean()) for w in windows]
        )
    move = np.array(moves)  # [1 + controls, windows]
    ratio, low, high, note = move_ratio(
        torch.tensor(move[0]), torch.tensor(move[1:].mean(0)), n_resamples, seed
    )
    return KeyRemoval(
        layer,
        head,
        top,
        float(entry["key"][0]["share"]),
        float(move[0].mean()),
        picked,
        float(move[1:].mean()),
        ratio,
        low,
        high,
        move.shape[1],
        "every query row read"
        if span is None
        else f"the later copies' query rows (positions {span[0]}-{span[1] - 1})",
        int(sum(int(kept[w].sum()) for w in windows)),
        note,
    )


def _check_verify_rows(loaded: Any, options: QKOptions) -> None:
    """``--verify`` on repeated tokens averages over the sampled rows in the later copies: refuse a
    ``--rows`` sample that leaves none in any evaluation window, before any pass (the sample is drawn
    from the seed, the windows' length and their index, all known now)."""
    n = options.windows
    spec = RepeatSpec(options.seq_len, options.repeat_seq, 2 * n, options.seed, None)
    sequences, _, offset = repeated_tokens(loaded, spec)
    start, stop = offset + options.seq_len, offset + options.seq_len * options.repeat_seq
    sample = RowSample(options.rows, options.seed, 1)
    if not any(bool(sample.read(len(sequences[n + i]), i)[start:stop].any()) for i in range(n)):
        raise InputError(
            f"--verify with --rows {options.rows}: no sampled query row falls in the later copies "
            f"(positions {start}-{stop - 1}) of any evaluation window",
            hint="raise --rows (0: every row), or --seq-len",
        )


# A move within this of none is float rounding: the rows are the model's (float32 here, qk refuses
# lower precisions), each entry rounded to eps of itself.
MOVE_FLOOR = RESOLVE * float(torch.finfo(torch.float32).eps)


def move_ratio(
    top_move: torch.Tensor, control: torch.Tensor, n_resamples: int, seed: int
) -> tuple[float | None, float | None, float | None, str]:
    """``(ratio, ci_low, ci_high, note)`` of the top source's move over the random sources' (per
    window), with its bootstrap interval; no ratio, with a note, where the random sources' move is
    within :data:`MOVE_FLOOR` (a ratio to float rounding is not a result)."""
    if float(control.mean()) <= MOVE_FLOOR:
        note = (
            f"the random sources move it by {float(control.mean()):.1e}, within float rounding "
            f"({MOVE_FLOOR:.1e}): no ratio"
            + ("" if float(top_move.mean()) > MOVE_FLOOR else "; the top source does not move it either")
        )
        return None, None, None, note
    low, high, _ = bootstrap_ratio(top_move, control, n_resamples=n_resamples, seed=seed)
    return float(top_move.sum() / control.sum()), _nan(float(low)), _nan(float(high)), ""


def _in_span(positions: torch.Tensor, span: tuple[int, int] | None) -> torch.Tensor:
    """Which query positions the protocol scores: all of them without a span."""
    if span is None:
        return torch.ones(len(positions), dtype=torch.bool)
    return (positions >= span[0]) & (positions < span[1])


def _keep_rows(
    store: dict, weights: torch.Tensor, batch: Any, q_start: int, head: int, sample: RowSample
) -> None:
    window = int(batch.example_index[0])
    read = sample(batch)[0]
    stop = q_start + weights.shape[2]
    picked = read[q_start:stop].nonzero().squeeze(1)
    length = int(batch.attention_mask[0].sum())
    rows = weights[0, head, picked, :length].double()
    if rows.shape[-1] < length:
        rows = torch.nn.functional.pad(rows, (0, length - rows.shape[-1]))
    before = store.get(window)
    if before is None:
        store[window] = (rows, picked + q_start)
    else:
        store[window] = (torch.cat([before[0], rows]), torch.cat([before[1], picked + q_start]))


# --- the analysis ---------------------------------------------------------------------------------------------


@register
class QK(Analysis):
    name = "qk"
    summary = (
        "Why each head attends where it does: its attention scores split exactly over the components "
        "that write its queries and keys (embedding, heads, MLPs), each source's share of its choice, "
        "and a causal check that removes the top source from the head's key input."
    )
    options = QKOptions
    print_sections = False
    takes_capture = False
    outputs = (
        Output(
            "--sources",
            "Write one row per (head, side, source) to this CSV (atomic): model, layer, head, kv_group, "
            "side, source, kind, role, share, ci_low, ci_high, n, rank, composition.",
            write_sources,
            first=True,
        ),
    )

    def check(self, options: QKOptions) -> QKInputs:
        check_common(options)
        heads = parse_heads(options.heads)
        langs = split_names(options.lang) or ["en"]
        if options.repeat_seq == 1:
            raise InputError(
                "--repeat-seq 1: a sequence needs at least 2 copies", hint="use 2 or more, or 0 for text"
            )
        if options.repeat_seq and options.eval_text is not None:
            raise InputError("give --repeat-seq or --eval-text, not both")
        fit_sources = [] if options.repeat_seq else shipped_sources("fit", langs)
        if options.eval_text is not None:
            eval_sources, eval_from = user_text_sources(options.eval_text), str(options.eval_text)
        else:
            eval_sources, eval_from = None, "the shipped evaluation split"
        return QKInputs(heads, fit_sources, eval_sources, eval_from)

    def check_loaded(self, loaded: Any, options: QKOptions) -> None:
        reason = refusal(loaded)
        if reason is not None:
            raise Unsupported(f"qk: {loaded.name} ({loaded.model.config.model_type}): {reason}")
        layout = loaded.layout
        check_heads(loaded, options.heads)
        if options.verify:
            heads = parse_heads(options.heads)
            asked = len(heads) if heads is not None else layout.n_layers * layout.n_heads
            above = (
                sum(1 for layer, _ in heads if layer > 0)
                if heads is not None
                else (layout.n_layers - 1) * layout.n_heads
            )
            if options.verify > above:
                raise InputError(
                    f"--verify {options.verify}: only {above} of the {asked} heads explained lie above "
                    "layer 0 (layer 0's heads read only the embedding: no lower source to remove)",
                    hint=f"use --verify {above}" if above else "add heads of later layers to --heads",
                )
            blocks = anatomy.blocks(loaded.model)
            fused = [
                i
                for i in attention_layers(loaded)
                if projections.separate_qkv(projections.attention_module(blocks[i])) is None
            ]
            if fused:
                raise InputError(
                    f"--verify: {loaded.name}'s attention has no separate key projection (a fused "
                    "query/key/value projection cannot be edited on the key side alone)",
                    hint="drop --verify",
                )
        if options.repeat_seq:
            length = options.seq_len * options.repeat_seq + 1
            check_context(loaded, length, f"--seq-len {options.seq_len} x --repeat-seq {options.repeat_seq}")
        else:
            check_context(loaded, options.context + 1, f"--context {options.context} (with BOS)")
        # what the windows decide, refused before the first pass (the model's own checks included)
        _windows(loaded, options, self.check(options))
        if options.verify and options.repeat_seq and options.rows:
            _check_verify_rows(loaded, options)

    def run(self, loaded: Any, options: QKOptions, prepared: QKInputs, progress: Any) -> Outcome:
        report, result, state = qk(loaded, options, prepared, progress)
        return Outcome(report, state={"qk": result, **state})

    def wants_verify(self, options: QKOptions) -> bool:
        return options.verify > 0

    def verify(
        self, loaded: Any, outcome: Outcome, options: QKOptions, progress: Any, k: int | None = None
    ) -> list[Any]:
        from headscope.extend.checks import Check

        removals = verify_heads(
            loaded,
            outcome.state["qk"],
            outcome.state,
            k or options.verify,
            options.controls,
            options.seed,
            options.resamples,
            progress,
        )
        return [Check("qk-key-removal", removals)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        out = {"qk": outcome.state["qk"].to_json()}
        checks = [c.to_json() for c in outcome.checks]
        if checks:
            out["verification"] = checks
        return out

    def present(self, result: Any, console: Any, top: int) -> None:
        from .qk_present import print_qk

        print_qk(result, console, top)

    def html_section(self, result: Any) -> str | None:
        from .qk_present import html_section

        found = result.qk
        return None if found is None else html_section(found)


def oracle_gap(loaded: Any, result: QKResult | None = None, **options: Any) -> float:
    """How far qk's pull-back is from the projection path (every source projected through the
    queries and keys, the oracle) on the same windows: :func:`shares_gap` of the two (tests and the
    conformance suite). ``result``: the pull-back's run with these ``options``, if already made."""
    chosen = QKOptions(**options)
    prepared = QK().check(chosen)
    fit, held, data, _ = _windows(loaded, chosen, prepared)
    settings = dict(
        rows=chosen.rows or None,
        seed=chosen.seed,
        n_resamples=chosen.resamples,
        repeated=bool(chosen.repeat_seq),
    )
    if result is None:
        result, _ = explain(loaded, fit, held, data, prepared.heads, **settings)
    oracle, _ = explain(loaded, fit, held, data, prepared.heads, oracle=True, **settings)
    return shares_gap(result, oracle)


def shares_gap(a: QKResult, b: QKResult) -> float:
    """The largest difference between two results' shares, their intervals, reconstructions and
    top pairs, head by head (inf where they list other heads or sources): how tests hold the
    pull-back to the projection path."""
    if [(e["layer"], e["head"]) for e in a.heads] != [(e["layer"], e["head"]) for e in b.heads]:
        return math.inf
    gap = 0.0
    for x, y in zip(a.heads, b.heads, strict=True):
        for side in SIDES:
            theirs = {item["source"]: item for item in y[side]}
            if set(theirs) != {item["source"] for item in x[side]}:
                return math.inf
            for item in x[side]:
                other = theirs[item["source"]]
                for name in ("share", "ci_low", "ci_high"):
                    if (item[name] is None) != (other[name] is None):
                        return math.inf
                    if item[name] is not None:
                        gap = max(gap, abs(item[name] - other[name]))
        for mine, their in zip(x.get("reconstructed", []), y.get("reconstructed", []), strict=True):
            gap = max(gap, abs(mine["explained"] - their["explained"]))
        for mine, their in zip(x.get("pairs", []), y.get("pairs", []), strict=True):
            gap = max(gap, abs(mine["share"] - their["share"]))
    return gap
