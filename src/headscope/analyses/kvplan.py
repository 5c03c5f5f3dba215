"""``kv-plan``: which KV heads need the whole context, which only a sink and a recent window.

DuoAttention (Xiao et al., ICLR 2025) keeps a full KV cache only for "retrieval" heads and serves
the others, "streaming" heads, from the first ``sink`` and the last ``recent`` tokens. It finds the
heads by optimising a gate per KV head on GPUs. This module finds them by measurement and checks
the plan, on a CPU:

1. **Score every candidate KV head** (the cache's unit; a KV head needs the full context if any of
   the query heads that read it does, so each score is the maximum over its query heads):
   * ``mass``: long-range attention mass (:mod:`headscope.detectors.kvcache`) on needle prompts
     and on long natural text, pooled;
   * ``retrieval``: the retrieval score of ``headscope retrieval`` at the answer tokens;
   * ``ablation`` (``method="ablation"``): leave-one-out, the rise in needle answer loss when that
     KV head alone is made streaming. Costs one needle pass per candidate; the cheaper scores are
     judged against it (Spearman's rank correlation).
   Only KV heads of global layers are candidates: a sliding-window or chunked layer (Gemma 3's
   local layers) already keeps a bounded cache.
2. **Plan at each sparsity** (the share of candidate KV heads made streaming): the lowest-ranked
   ``n`` candidates stream, with ``n`` as DuoAttention's ``sparsify_attention_heads`` would choose
   it from a quantile of the scores (``ceil(s * (N - 1))``, all N at s = 1).
3. **Verify each plan** against random plans of the same size (every same-size set when there are
   no more than ``draws`` of them): needle accuracy and answer loss, the next-token loss on natural
   text at positions past the window, and the KV-cache memory the plan would save (computed).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope import capture
from headscope.data.circuits import load_haystack
from headscope.errors import InputError, NotApplicable, elide
from headscope.extend.base import ProgressFactory, Report, pad_token_of, prompt_set_report
from headscope.extend.checks import Check, one_check
from headscope.extend.protocol import Analysis, Outcome, Output, Stats, check_common, option, register
from headscope.extend.writers import html_grid, named
from headscope.models import HeadLayout, LoadedModel
from headscope.verdicts.stats import bootstrap_ratio

from .kvplan_present import check_plan_dir, plan_folder, section_html
from .retrieval import (
    NeedleInputs,
    NeedlePrompt,
    Needles,
    _joined,
    _measure,
    _needle_inputs,
    build_prompts,
    needle_batches,
    parse_contexts,
)

KV = tuple[int, int]  # (layer, KV head)
METHODS = ("retrieval", "mass", "ablation")
KV_DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
# DuoAttention's deploy settings (scripts/niah.sh, scripts/longbench.sh, README in mit-han-lab/duo-attention).
DEFAULT_SINK = 64
DEFAULT_RECENT = 256


# --- options ------------------------------------------------------------------------------------------


def parse_sparsities(text: str) -> tuple[float, ...]:
    parts = [part.strip() for part in str(text).split(",") if part.strip()]
    if not parts:
        raise InputError(
            f"--sparsity {elide(str(text))}: the list is empty", hint="give e.g. --sparsity 0.25,0.5,0.75"
        )
    values = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise InputError(
                f"--sparsity {elide(str(text))}: {elide(part)} is not a number",
                hint="shares of KV heads made streaming, e.g. 0.25,0.5,0.75",
            ) from None
        if not 0.0 <= value <= 1.0 or math.isnan(value):
            raise InputError(
                f"--sparsity {elide(str(text))}: {elide(part)} is outside [0, 1]",
                hint="the sparsity is the share of KV heads made streaming: 0 = none, 1 = all",
            )
        if value in values:
            raise InputError(
                f"--sparsity {elide(str(text))}: {elide(part)} is given twice", hint="each value once"
            )
        values.append(value)
    return tuple(sorted(values))


def check_window(sink: int, recent: int, contexts: Sequence[int]) -> None:
    """Refuse a window that covers a whole context (nothing would be streamed)."""
    if sink < 0:
        raise InputError(f"--sink {sink}: must be at least 0")
    if recent < 1:
        raise InputError(f"--recent {recent}: must be at least 1 (the query's own key)")
    for context in contexts:
        if sink + recent >= context:
            raise InputError(
                f"--sink {sink} + --recent {recent} = {sink + recent} tokens covers the whole --context {context}",
                hint=f"use a context of at least 4 x {sink + recent} = {4 * (sink + recent)} tokens, or a smaller window",
            )


def n_streaming(sparsity: float, n_candidates: int) -> int:
    """How many of ``n_candidates`` KV heads stream at ``sparsity``, exactly as DuoAttention's
    ``sparsify_attention_heads`` decides it from N distinct scores: the heads below the scores'
    ``sparsity`` quantile (numpy's, linear) stream, so about ceil(s * (N - 1)); s >= 1 streams all."""
    if sparsity >= 1.0:
        return n_candidates
    if sparsity <= 0.0 or n_candidates <= 1:
        return 0
    ranks = np.arange(n_candidates) / (n_candidates - 1)
    return int((ranks < np.quantile(ranks, sparsity)).sum())


def candidates(layout: HeadLayout) -> list[KV]:
    """KV heads of the layers that see every earlier key: the only ones a plan can shorten."""
    return [(layer, kv) for layer in layout.global_layers for kv in range(layout.n_kv_heads)]


def candidate_note(loaded: LoadedModel) -> str | None:
    """Why some layers are not candidates (Gemma 3: its sliding-window layers), or None."""
    layout = loaded.layout
    narrowed = sorted(set(layout.attention_layers) - set(layout.global_layers))
    if not narrowed:
        return None
    what = []
    if layout.local_layers:
        what.append(f"{len(layout.local_layers)} sliding-window layers ({layout.window} tokens)")
    if layout.chunked_layers:
        what.append(f"{len(layout.chunked_layers)} chunked layers ({layout.chunk} tokens)")
    return (
        f"{loaded.name}: {' and '.join(what)} already keep a bounded cache; only the "
        f"{len(layout.global_layers) * layout.n_kv_heads} KV heads of the {len(layout.global_layers)} "
        f"global layers ({', '.join(str(x) for x in layout.global_layers)}) are candidates, and each "
        "sparsity is a share of those"
    )


# --- natural text ---------------------------------------------------------------------------------------


def text_rows(
    loaded: LoadedModel, sentences: Sequence[str], context: int, chunks: int
) -> tuple[list[list[int]], list[list[bool]]]:
    """Up to ``chunks`` consecutive stretches of ``context`` tokens of the text (BOS first where the
    tokenizer adds one), and their special-token masks (the BOS)."""
    tokenizer = loaded.tokenizer
    lead = tokenizer("", add_special_tokens=True)["input_ids"]  # BOS (or nothing)
    body = context - len(lead)
    wanted = body * chunks
    ids: list[int] = []
    for sentence in sentences:  # sentence by sentence: no over-long encode, stop when there is enough
        ids += tokenizer(" " + sentence, add_special_tokens=False)["input_ids"]
        if len(ids) >= wanted:
            break
    rows = [lead + ids[i : i + body] for i in range(0, len(ids) - body + 1, body)][:chunks]
    return rows, [[i < len(lead) for i in range(len(row))] for row in rows]


# --- evaluation -------------------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """One attention layout's outcome: needle accuracy and answer loss, and natural-text loss."""

    accuracy: float
    answer_loss: float
    text_loss: float | None  # mean next-token loss at text positions past the window
    per_prompt: list[bool] = field(repr=False, default_factory=list)
    per_prompt_loss: list[float] = field(repr=False, default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "answer_loss": self.answer_loss, "text_loss": self.text_loss}


@dataclass
class Inputs:
    prompts: list[NeedlePrompt]
    needle_batches: list[capture.Batch]
    text_batches: list[capture.Batch]
    window: int  # sink + recent


def _text_loss(
    loaded: LoadedModel,
    inputs: Inputs,
    streaming: capture.StreamingHeads | None,
    on_layer: Any = None,
    advance: Any = None,
    reads: Any = None,
) -> float | None:
    if not inputs.text_batches:
        return None
    total, count = 0.0, 0

    def on_loss(losses: torch.Tensor, batch: capture.Batch) -> None:
        nonlocal total, count
        positions = batch.positions()[:, :-1]
        real = batch.attention_mask[:, :-1] & batch.attention_mask[:, 1:]
        counted = real & (positions >= inputs.window)  # the only predictions a streaming head changes
        total += float(losses[counted].double().sum())
        count += int(counted.sum())

    attention = capture.Attention(on_layer, rows=reads) if on_layer is not None else None
    capture.run(
        loaded,
        inputs.text_batches,
        capture.Pass(
            reads=[attention, capture.TokenLosses(on_loss)],
            edits=[streaming],
            on_batch_done=(lambda b: advance(len(b.example_index))) if advance else None,
        ),
    )
    return total / max(1, count)


def evaluate(
    loaded: LoadedModel,
    inputs: Inputs,
    streaming: capture.StreamingHeads | None,
    progress: ProgressFactory | None,
    label: str,
    *,
    text: bool = True,
) -> Evaluation:
    needle = _measure(loaded, inputs.prompts, inputs.needle_batches, None, None, progress, label, streaming)
    text_loss = None
    if text and inputs.text_batches:
        advance = (
            progress(f"{label} (text)", sum(len(b.example_index) for b in inputs.text_batches))
            if progress
            else None
        )
        text_loss = _text_loss(loaded, inputs, streaming, advance=advance)
    return Evaluation(
        needle.accuracy, needle.answer_loss, text_loss, needle.per_prompt, needle.per_prompt_loss
    )


# --- memory ---------------------------------------------------------------------------------------------


def kv_cache_bytes(
    layout: HeadLayout, context: int, bytes_per_value: int, streaming: Sequence[KV] = (), window: int = 0
) -> int:
    """Bytes of keys and values cached for one sequence of ``context`` tokens: every attention
    layer's KV heads, a sliding-window layer's up to its window, a streaming head's ``window`` tokens."""
    streamed = set(streaming)
    per_token = (layout.head_dim + layout.v_head_dim) * bytes_per_value
    total = 0
    for layer in layout.attention_layers:
        if layer in layout.local_layers and layout.window:
            own = min(context, layout.window)
        elif layer in layout.chunked_layers and layout.chunk:
            own = min(context, layout.chunk)
        else:
            own = context
        for kv in range(layout.n_kv_heads):
            tokens = min(own, window) if (layer, kv) in streamed else own
            total += tokens * per_token
    return total


def memory_row(
    layout: HeadLayout, context: int, bytes_per_value: int, streaming: Sequence[KV], window: int
) -> dict[str, Any]:
    full = kv_cache_bytes(layout, context, bytes_per_value)
    plan = kv_cache_bytes(layout, context, bytes_per_value, streaming, window)
    return {
        "context": context,
        "full_bytes": full,
        "plan_bytes": plan,
        "saved_share": 1.0 - plan / full if full else 0.0,
        "reduction": full / plan if plan else float("inf"),
    }


# --- the plan ---------------------------------------------------------------------------------------------


@dataclass
class SparsityResult:
    sparsity: float
    n_streaming: int
    streaming: list[KV]
    plan: Evaluation
    random_sets: list[list[KV]]
    random: list[Evaluation]
    exhaustive: bool
    memory: list[dict[str, Any]]
    # With compare: the plans the other measured scores make at this sparsity, applied.
    others: dict[str, tuple[list[KV], Evaluation]] = field(default_factory=dict)

    def random_mean(self, key: str) -> float | None:
        values = [getattr(e, key) for e in self.random if getattr(e, key) is not None]
        return float(np.mean(values)) if values else None

    def to_json(self) -> dict[str, Any]:
        return {
            "sparsity": self.sparsity,
            "n_streaming": self.n_streaming,
            "streaming": [list(kv) for kv in self.streaming],
            "plan": self.plan.to_json(),
            "random": [
                {"streaming": [list(kv) for kv in kvs], **e.to_json()}
                for kvs, e in zip(self.random_sets, self.random, strict=True)
            ],
            "random_mean": {key: self.random_mean(key) for key in ("accuracy", "answer_loss", "text_loss")},
            "random_exhaustive": self.exhaustive,
            "memory": self.memory,
            "other_methods": {
                method: {"streaming": [list(kv) for kv in kvs], **e.to_json()}
                for method, (kvs, e) in self.others.items()
            }
            or None,
        }


@dataclass
class KVPlan:
    """The plan and its verification (the ``kv-plan`` check)."""

    model: str
    method: str
    sink: int
    recent: int
    contexts: list[int]
    layout: HeadLayout
    candidates: list[KV]
    rows: list[dict[str, Any]]  # one per KV head of every attention layer
    full: Evaluation
    sparsities: list[SparsityResult] = field(default_factory=list)
    kv_dtype: str = "float32"
    agreement: dict[str, float] = field(default_factory=dict)  # Spearman of cheap scores vs ablation
    notes: list[str] = field(default_factory=list)
    n_prompts: int = 0
    n_text: int = 0
    # Where the plans were applied and checked, when not at the scoring lengths (--apply-context).
    applied_contexts: list[int] | None = None
    applied_prompts: int = 0
    applied_text: int = 0

    @property
    def ranked(self) -> list[KV]:
        """Candidates from the one that most needs the full context to the least (by ``method``)."""
        return ranking(self, self.method)

    def decision(self, kv: KV, result: SparsityResult) -> str:
        if kv not in self.candidates:
            return "window"
        return "streaming" if kv in result.streaming else "full"

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope kv-plan``; ``top``: KV heads listed)."""
        from .kvplan_present import print_kv_plan

        print_kv_plan(self, console, top)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "kv-plan",
            "model": self.model,
            "method": self.method,
            "sink": self.sink,
            "recent": self.recent,
            "contexts": self.contexts,
            "kv_dtype": self.kv_dtype,
            "layers": self.layout.n_layers,
            "kv_heads": self.layout.n_kv_heads,
            "candidates": [list(kv) for kv in self.candidates],
            "prompts": self.n_prompts,
            "text_chunks": self.n_text,
            "heads": self.rows,
            "applied_contexts": self.applied_contexts,
            "applied_prompts": self.applied_prompts or None,
            "applied_text_chunks": self.applied_text or None,
            "full": self.full.to_json(),
            "sparsities": [s.to_json() for s in self.sparsities],
            "agreement": self.agreement or None,
            "notes": self.notes,
        }


def _kv_best(
    scores: np.ndarray, low: np.ndarray, high: np.ndarray, layout: HeadLayout, kv: KV
) -> tuple[float, float, float, list[int]]:
    """A KV head's score: the highest of its query heads' (with that head's interval)."""
    layer, group = kv
    heads = list(range(group * layout.group_size, (group + 1) * layout.group_size))
    best = max(heads, key=lambda h: scores[layer, h])
    return float(scores[layer, best]), float(low[layer, best]), float(high[layer, best]), heads


def _table_arrays(table: Any, detector: str, layout: HeadLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[L, H] score, 95% low and high of one detector's rows in the report's tidy table (NaN where
    the table has no interval)."""
    arrays = [np.full((layout.n_layers, layout.n_heads), np.nan) for _ in range(3)]
    rows = table[table["detector"] == detector]
    layers, heads = rows["layer"].to_numpy(int), rows["head"].to_numpy(int)
    for array, column in zip(arrays, ("score", "ci_low", "ci_high"), strict=True):
        array[layers, heads] = rows[column].to_numpy(float)
    return arrays[0], arrays[1], arrays[2]


def _pooled(results: Sequence[Any], n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sums = torch.cat([r.sums for r in results])
    counts = torch.cat([r.counts for r in results])
    score = (sums.sum(0) / counts.sum().clamp(min=1)).numpy()
    low, high, _ = bootstrap_ratio(sums, counts, n_resamples=n_resamples, seed=seed)
    return score, low, high


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    ra, rb = _ranks(np.asarray(a, dtype=float)), _ranks(np.asarray(b, dtype=float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for value in np.unique(values):  # ties share their mean rank
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


@dataclass
class Scored:
    report: Report
    plan: KVPlan
    inputs: Inputs


def score(
    loaded: LoadedModel,
    needles: Any,
    haystack: Sequence[str],
    text: Sequence[str],
    *,
    contexts: Sequence[int],
    depths: Sequence[float],
    sink: int,
    recent: int,
    method: str,
    text_chunks: int,
    kv_dtype: str,
    batch_size: int,
    n_resamples: int,
    seed: int,
    progress: ProgressFactory | None,
) -> Scored:
    """Step 1: every KV head's scores on full attention, and the full-attention reference."""
    from headscope.detectors.circuits import RetrievalDetector
    from headscope.detectors.kvcache import LongRangeDetector

    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError(
            f"{loaded.name} is not a causal language model: a KV-cache plan is for models that generate "
            "(an encoder keeps no KV cache)"
        )
    limit = loaded.max_positions
    for context in contexts:
        if limit is not None and context > limit:
            raise InputError(
                f"--context {context} is longer than {loaded.name}'s context of {limit} tokens",
                hint=f"use at most {limit}",
            )
    if loaded.capture_mode != "stream":
        raise NotApplicable(
            f"{loaded.name}: streaming heads need headscope's own attention function, and its check failed on "
            "this model (it fell back to eager capture)"
        )
    text_config = (
        loaded.model.config.get_text_config() if hasattr(loaded.model.config, "get_text_config") else None
    )
    if getattr(text_config, "kv_lora_rank", None):
        raise NotApplicable(
            f"{loaded.name} uses multi-head latent attention: its cache holds one latent per token shared by every "
            "head, so a per-KV-head plan does not apply"
        )
    layout = loaded.layout
    kvs = candidates(layout)
    if not kvs:
        raise NotApplicable(
            f"{loaded.name} has no global attention layer: every layer's cache is already bounded"
        )
    inputs, notes, rows = build_inputs(
        loaded, needles, haystack, text, contexts, depths, sink, recent, text_chunks, batch_size, seed
    )
    prompts, batches = inputs.prompts, inputs.needle_batches

    # One full-attention pass over the needles (retrieval, long-range mass) and one over the text.
    retrieval = RetrievalDetector()
    retrieval.start(layout, len(needles.items))
    mass_needle = LongRangeDetector(sink, recent)
    mass_needle.start(layout, len(needles.items))

    needle = _measure(
        loaded,
        prompts,
        batches,
        _Both(retrieval, mass_needle),
        None,
        progress,
        "full attention",
    )
    mass_text = LongRangeDetector(sink, recent)
    mass_text.start(layout, len(rows))
    advance = progress("full attention (text)", len(rows)) if progress else None
    text_loss = _text_loss(
        loaded, inputs, None, on_layer=mass_text.update, advance=advance, reads=mass_text.reads
    )
    full = Evaluation(
        needle.accuracy, needle.answer_loss, text_loss, needle.per_prompt, needle.per_prompt_loss
    )

    needle_result = mass_needle.results("needles")[0]
    text_result = mass_text.results("text")[0]
    retrieval_result = retrieval.results("needles")[0]
    description = f"{len(prompts)} needle prompts at {','.join(str(c) for c in contexts)} tokens"
    report = prompt_set_report(
        loaded,
        [needle_result, text_result, retrieval_result],
        "needles",
        description,
        notes,
        batches,
        n_resamples,
        seed,
        outcomes={"needles": needle},
    )
    for section in report.sections:
        if section.data == "text":
            section.description = (
                f"{len(rows)} stretches of natural text of {','.join(str(c) for c in contexts)} tokens"
            )

    mass = _pooled([needle_result, text_result], n_resamples, seed)
    m_needle = needle_result.scores().numpy()
    m_text = text_result.scores().numpy()
    r_score, r_low, r_high = _table_arrays(report.table, "retrieval", layout)  # bootstrapped once, there
    table_rows = []
    for layer in layout.attention_layers:
        for kv in range(layout.n_kv_heads):
            value, low, high, heads = _kv_best(*mass, layout, (layer, kv))
            rvalue, rlow, rhigh, _ = _kv_best(r_score, r_low, r_high, layout, (layer, kv))
            table_rows.append(
                {
                    "layer": layer,
                    "kv_head": kv,
                    "query_heads": heads,
                    "candidate": (layer, kv) in kvs,
                    "mass": value,
                    "mass_low": _finite(low),
                    "mass_high": _finite(high),
                    "mass_needles": float(max(m_needle[layer, h] for h in heads)),
                    "mass_text": float(max(m_text[layer, h] for h in heads)),
                    "retrieval": rvalue,
                    "retrieval_low": _finite(rlow),
                    "retrieval_high": _finite(rhigh),
                    "ablation": None,
                    "ablation_low": None,
                    "ablation_high": None,
                    "rank_score": None,
                }
            )
    if method == "retrieval" and not any(r["retrieval"] > 0 for r in table_rows if r["candidate"]):
        notes.append(
            "no candidate KV head scored on retrieval (it counts only answers the model gets right under full "
            "attention): the ranking is the long-range mass, its tie-breaker"
        )
    plan = KVPlan(
        loaded.name,
        method,
        sink,
        recent,
        list(contexts),
        layout,
        kvs,
        table_rows,
        full,
        kv_dtype=kv_dtype,
        notes=list(notes),
        n_prompts=len(prompts),
        n_text=len(rows),
    )
    note = candidate_note(loaded)
    if note:
        plan.notes.insert(0, note)
    if method == "ablation":
        _leave_one_out(loaded, plan, inputs, needles, n_resamples, seed, progress)
    _rank(plan)
    return Scored(report, plan, inputs)


def build_inputs(
    loaded: LoadedModel,
    needles: Any,
    haystack: Sequence[str],
    text: Sequence[str],
    contexts: Sequence[int],
    depths: Sequence[float],
    sink: int,
    recent: int,
    text_chunks: int,
    batch_size: int,
    seed: int,
    *,
    flag: str = "--context",
) -> tuple[Inputs, list[str], list[list[int]]]:
    """The needle prompts and the stretches of natural text at ``contexts``, batched; notes on them.
    ``flag``: the option that asked for these lengths, named in a refusal (``--apply-context``)."""
    try:
        prompts = build_prompts(loaded, needles, haystack, contexts, depths, seed=seed)
    except InputError as exc:
        # build_prompts names the lengths "--context N"; these may be --apply-context's
        if flag == "--context" or not exc.message.startswith("--context "):
            raise
        raise InputError(flag + exc.message.removeprefix("--context"), hint=exc.hint) from None
    batches = needle_batches(loaded, prompts, batch_size)
    rows: list[list[int]] = []
    specials: list[list[bool]] = []
    for context in contexts:
        more, masks = text_rows(loaded, text, context, text_chunks)
        rows += more
        specials += masks
    notes = []
    if not rows:
        raise InputError(
            f"the natural text is shorter than {flag} {max(contexts)} tokens",
            hint="give a longer --text file",
        )
    if len(rows) < text_chunks * len(contexts):
        notes.append(
            f"natural text: {len(rows)} chunk(s) of the context length, fewer than the {text_chunks} asked for per context"
        )
    text_batches = capture.make_batches(
        rows,
        specials,
        batch_size=batch_size,
        pad_id=pad_token_of(loaded),
        is_causal=True,
        meta=[{"chunk": i} for i in range(len(rows))],
    )
    inside = sum(1 for p in prompts if _needle_in_window(p, sink, recent))
    if inside:
        notes.append(
            f"{inside} of {len(prompts)} needle prompts have the needle inside the first {sink} or the last "
            f"{recent} tokens before the answer, where a streaming head still sees it"
        )
    return Inputs(prompts, batches, text_batches, sink + recent), notes, rows


def _applied_inputs(
    loaded: LoadedModel, prepared: Any, options: Any
) -> tuple[Inputs, list[str], list[list[int]]]:
    """The prompts and text at ``--apply-context`` (tokenized only: built, and refused, before the
    first forward pass)."""
    return build_inputs(
        loaded,
        prepared.needles,
        prepared.haystack,
        prepared.text,
        prepared.applied,
        prepared.depths,
        options.sink,
        options.recent,
        options.text_chunks,
        options.batch_size,
        options.seed,
        flag="--apply-context",
    )


def _apply_at(
    loaded: LoadedModel,
    scored: Scored,
    prepared: Any,
    applied: tuple[Inputs, list[str], list[list[int]]],
    progress: Any,
) -> None:
    """Swap the plan's checking inputs for prompts and text at ``--apply-context``, with their own
    full-attention reference: the plans ranked on the scoring lengths are then applied there."""
    inputs, notes, rows = applied
    plan = scored.plan
    plan.full = evaluate(loaded, inputs, None, progress, "full attention (applied)")
    plan.applied_contexts = list(prepared.applied)
    plan.applied_prompts = len(inputs.prompts)
    plan.applied_text = len(rows)
    plan.notes += [f"at --apply-context: {note}" for note in notes]
    scored.inputs = inputs


class _Both:
    """The retrieval detector and the long-range mass on one needle pass (``_measure`` settles it)."""

    def __init__(self, retrieval: Any, mass: Any) -> None:
        self.retrieval, self.mass = retrieval, mass

    def update(self, layer: int, attn: torch.Tensor, batch: capture.Batch, q_start: int = 0) -> None:
        self.retrieval.update(layer, attn, batch, q_start)
        self.mass.update(layer, attn, batch, q_start)

    def settle(self, batch: capture.Batch, correct: dict[tuple[int, int], bool]) -> None:
        self.retrieval.settle(batch, correct)

    def reads(self, batch: capture.Batch) -> torch.Tensor | None:
        return capture.rows.union([self.retrieval.reads, self.mass.reads])(batch)


def _finite(value: float) -> float | None:
    return None if value != value else float(value)


def _needle_in_window(prompt: NeedlePrompt, sink: int, recent: int) -> bool:
    """Whether a streaming head still sees every needle token the answer copies, at the first answer query."""
    keys = [k for ks in prompt.needle_keys for k in ks]
    if not keys or not prompt.queries:
        return False
    query = prompt.queries[0]
    return all(k < sink or query - k < recent for k in keys)


def _leave_one_out(
    loaded: LoadedModel,
    plan: KVPlan,
    inputs: Inputs,
    needles: Any,
    n_resamples: int,
    seed: int,
    progress: ProgressFactory | None,
) -> None:
    """Make each candidate KV head streaming alone; record the rise in needle answer loss."""
    base = np.asarray(plan.full.per_prompt_loss)
    units = torch.as_tensor([p.needle for p in inputs.prompts])
    n_units = len(needles.items)
    by_kv = {(r["layer"], r["kv_head"]): r for r in plan.rows}
    for kv in plan.candidates:
        streaming = capture.StreamingHeads.of([kv], plan.sink, plan.recent)
        outcome = evaluate(
            loaded, inputs, streaming, progress, f"leave-one-out L{kv[0]} KV{kv[1]}", text=False
        )
        delta = torch.as_tensor(np.asarray(outcome.per_prompt_loss) - base, dtype=torch.float64)
        sums = torch.zeros(n_units, dtype=torch.float64).index_add_(0, units, delta)[:, None]
        counts = torch.zeros(n_units, dtype=torch.float64).index_add_(0, units, torch.ones_like(delta))
        low, high, _ = bootstrap_ratio(sums, counts, n_resamples=n_resamples, seed=seed)
        row = by_kv[kv]
        row["ablation"] = float(delta.mean())
        row["ablation_low"] = _finite(float(low[0]))
        row["ablation_high"] = _finite(float(high[0]))
    rows = [by_kv[kv] for kv in plan.candidates]
    truth = [r["ablation"] for r in rows]
    if len(rows) >= 3:
        plan.agreement = {
            "mass": spearman([r["mass"] for r in rows], truth),
            "retrieval": spearman([r["retrieval"] for r in rows], truth),
        }


def ranking(plan: KVPlan, method: str) -> list[KV]:
    """The candidates by ``method``'s score, from the one that most needs the full context to the
    least (ties: the long-range mass, then the earlier layer and KV head first)."""
    rows = [r for r in plan.rows if r["candidate"]]
    order = sorted(rows, key=lambda r: (-r[method], -r["mass"], r["layer"], r["kv_head"]))
    return [(r["layer"], r["kv_head"]) for r in order]


def methods_of(plan: KVPlan) -> list[str]:
    """The scores this run measured, the plan's own first (ablation only where it was run)."""
    ablated = any(r["ablation"] is not None for r in plan.rows)
    measured = [m for m in METHODS if m != "ablation" or ablated]
    return [plan.method, *(m for m in measured if m != plan.method)]


def _rank(plan: KVPlan) -> None:
    """Store each candidate's rank score in [0, 1] under the plan's method (1 = needs the full
    context most); KV heads that are not candidates get 1 (they keep their own bounded attention)."""
    order = ranking(plan, plan.method)
    n = len(order)
    position = {kv: index for index, kv in enumerate(order)}
    for row in plan.rows:
        kv = (row["layer"], row["kv_head"])
        row["rank_score"] = (1.0 - position[kv] / (n - 1) if n > 1 else 1.0) if kv in position else 1.0


def verify(
    loaded: LoadedModel,
    scored: Scored,
    sparsities: Sequence[float],
    *,
    draws: int,
    seed: int,
    progress: ProgressFactory | None,
    compare: bool = False,
) -> KVPlan:
    """Steps 2 and 3: a plan at each sparsity, applied, against random plans of the same size.
    ``compare``: also apply the plans the run's other scores would make, against the same draws."""
    plan = scored.plan
    inputs = scored.inputs
    orders = {method: ranking(plan, method) for method in (methods_of(plan) if compare else [plan.method])}
    ranked = orders[plan.method]
    n = len(ranked)
    rng = random.Random(seed)
    bytes_per_value = KV_DTYPES[plan.kv_dtype]
    layout = plan.layout
    contexts = sorted({max(plan.contexts), *([layout.max_positions] if layout.max_positions else [])})
    for sparsity in sparsities:
        k = n_streaming(sparsity, n)
        streaming = sorted(ranked[n - k :]) if k else []
        heads = capture.StreamingHeads.of(streaming, plan.sink, plan.recent)
        result = evaluate(loaded, inputs, heads, progress, f"plan {sparsity:g}")
        others: dict[str, tuple[list[KV], Evaluation]] = {}
        for method, order in orders.items():
            if method == plan.method:
                continue
            theirs = sorted(order[n - k :]) if k else []
            if theirs == streaming:
                others[method] = (theirs, result)
                continue
            label = f"{method} plan {sparsity:g}"
            others[method] = (
                theirs,
                evaluate(
                    loaded, inputs, capture.StreamingHeads.of(theirs, plan.sink, plan.recent), progress, label
                ),
            )
        if 0 < k < n:
            total = math.comb(n, k)
            exhaustive = total <= draws
            if exhaustive:
                sets = [sorted(c) for c in itertools.combinations(sorted(ranked), k)]
            else:
                sets = []
                while len(sets) < draws:  # distinct sets (there are more than `draws` of them)
                    drawn = sorted(rng.sample(sorted(ranked), k))
                    if drawn not in sets:
                        sets.append(drawn)
        else:
            exhaustive, sets = True, []  # none or all streaming: every plan is the same
        randoms = [
            evaluate(
                loaded,
                inputs,
                capture.StreamingHeads.of(s, plan.sink, plan.recent),
                progress,
                f"random {sparsity:g} #{i + 1}",
            )
            for i, s in enumerate(sets)
        ]
        memory = [
            memory_row(layout, c, bytes_per_value, streaming, plan.sink + plan.recent) for c in contexts
        ]
        plan.sparsities.append(
            SparsityResult(sparsity, k, streaming, result, sets, randoms, exhaustive, memory, others)
        )
    return plan


# --- the analysis: options, check, run, verify (the plan against random plans), JSON ---------------


@dataclass(kw_only=True)
class KVPlanOptions(Needles, Stats):
    sparsity: str | float | list[float] = option(
        "0.25,0.5,0.75",
        "Shares of the candidate KV heads made streaming, comma-separated, each in [0, 1].",
        cli_type=str,
    )
    sink: int = option(64, "Attention-sink tokens a streaming head keeps (DuoAttention deploys 64).")
    recent: int = option(
        256, "Recent tokens a streaming head keeps, the query's own included (DuoAttention: 256)."
    )
    method: str = option(
        "retrieval",
        "What ranks the KV heads: retrieval score (ties: long-range mass), long-range attention mass, "
        "or leave-one-out ablation (one needle pass per KV head).",
        choices=("retrieval", "mass", "ablation"),
    )
    compare: bool = option(
        False,
        "Also apply the plans that the run's other scores make, against the same random plans.",
    )
    text: str | Path | None = option(
        None,
        "Long natural text (.txt or .conllu) for the long-range mass and the LM loss (default: the haystack).",
        cli_type=Path | None,
    )
    context: str | int | list[int] = option(
        "1280",
        "Prompt lengths in tokens, comma-separated; at least 4 x (sink + recent) to test the window.",
        cli_type=str,
    )
    depths: str | list[float] = option(
        "0.1,0.4,0.7", "Needle depths: fractions of the context, 0 = start, 1 = end.", cli_type=str
    )
    apply_context: str | int | list[int] | None = option(
        None,
        "Apply the plans, and the random ones, at these lengths instead of the scoring ones "
        "(comma-separated): does a plan chosen on --context prompts hold on longer ones?",
        cli_type=str | None,
    )
    needles: int | None = option(8, "Use only the first N needles (default 8; 0 or none: all).", min=0)
    text_chunks: int = option(3, "Stretches of natural text of the context length, per context.", min=1)
    draws: int = option(3, "Random plans per sparsity (all same-size plans when there are no more).", min=1)
    kv_dtype: str = option(
        "auto",
        "The cache's dtype for the memory figures (auto: the model's).",
        choices=("auto", "float32", "bfloat16", "float16", "int8"),
    )
    batch_size: int = option(2, "Prompts per forward pass.", min=1)


@dataclass(frozen=True)
class KVPlanInputs(NeedleInputs):
    """The needle inputs, the sparsities to apply, and the natural text (the haystack by default)."""

    sparsities: tuple[float, ...]
    text: list[str]
    applied: tuple[int, ...] | None = None


def _check_plan_folder(path: Path, options: Any, force: bool) -> list[str]:
    """``--out`` before the model loads: the folder is writable; an earlier run's plans it leaves."""
    return [
        f"--out {path}: {name}/ is an earlier run's plan; this run leaves it as it is"
        for name in check_plan_dir(path, force, parse_sparsities(str(options.sparsity)))
    ]


@register
class KVPlanAnalysis(Analysis):
    name = "kv-plan"
    summary = (
        "A KV-cache plan: which KV heads need the whole context and which only a sink and a recent window, "
        "checked against random plans."
    )
    options = KVPlanOptions
    takes_capture = False
    print_sections = False
    outputs = (
        Output(
            "--out",
            "Write the plan into this folder: DuoAttention's full_attention_heads.tsv and config.json "
            "(and one folder per sparsity), plan.csv and curve.png.",
            named("plan-folder", check_folder=_check_plan_folder)(plan_folder),
            kind="folder",
            first=True,
        ),
        Output("--html", "Write a self-contained HTML report with the KV-head grid.", html_grid, first=True),
    )

    def html_section(self, result: Any) -> str | None:
        """The KV-head grid and, per sparsity, the plan against random plans (from the result's JSON)."""
        return section_html(result.to_dict())

    def check(self, options: KVPlanOptions) -> KVPlanInputs:
        check_common(options)
        sparsities = parse_sparsities(_joined(options.sparsity))
        needle = _needle_inputs(
            options, lambda contexts: check_window(options.sink, options.recent, contexts)
        )
        if options.text is not None and Path(options.text).is_dir():
            raise InputError(
                f"--text {options.text}: a folder, not a text file",
                hint="give a UTF-8 .txt file or a CoNLL-U treebank (.conllu)",
            )
        text = needle.haystack if options.text is None else load_haystack(options.text)
        applied = None
        if options.apply_context is not None:
            applied = parse_contexts(_joined(options.apply_context), "--apply-context")
            check_window(options.sink, options.recent, applied)
        return KVPlanInputs(
            needles=needle.needles,
            haystack=needle.haystack,
            contexts=needle.contexts,
            depths=needle.depths,
            sparsities=sparsities,
            text=text,
            applied=applied,
        )

    def run(self, loaded: Any, options: KVPlanOptions, prepared: KVPlanInputs, progress: Any) -> Outcome:
        dtype = options.kv_dtype
        if dtype == "auto":
            dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
            dtype = dtype if dtype in KV_DTYPES else "float32"
        limit = loaded.max_positions
        for context in prepared.applied or ():
            if limit is not None and context > limit:
                raise InputError(
                    f"--apply-context {context} is longer than {loaded.name}'s context of {limit} tokens",
                    hint=f"use at most {limit}",
                )
        applied = None if prepared.applied is None else _applied_inputs(loaded, prepared, options)
        scored = score(
            loaded,
            prepared.needles,
            prepared.haystack,
            prepared.text,
            contexts=prepared.contexts,
            depths=prepared.depths,
            sink=options.sink,
            recent=options.recent,
            method=options.method,
            text_chunks=options.text_chunks,
            kv_dtype=dtype,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        if applied is not None:
            _apply_at(loaded, scored, prepared, applied, progress)
        return Outcome(scored.report, state={"scored": scored, "sparsities": prepared.sparsities})

    def wants_verify(self, options: KVPlanOptions) -> bool:
        return True  # the plan is not a plan until it is applied and compared with random ones

    def verify(
        self, loaded: Any, outcome: Outcome, options: KVPlanOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        plan = verify(  # this module's verify: the plans applied, against random plans
            loaded,
            outcome.state["scored"],
            outcome.state["sparsities"],
            draws=options.draws,
            seed=options.seed,
            progress=progress,
            compare=options.compare,
        )
        return [Check("kv-plan", plan)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"kv_plan": one_check(outcome, "kv-plan")}
