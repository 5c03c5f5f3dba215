"""``retrieval``: needle in a haystack, and the heads that copy the needle (Wu et al. 2024).

Each prompt is filler text with one needle sentence inserted at a sentence boundary, at a chosen
depth, then the question and the start of the answer sentence, then the gold answer:

    <haystack … needle … haystack>\\n\\nQuestion: <question>\\nAnswer: <needle up to the answer><answer>

It is scored teacher-forced, in one forward pass. At each answer token where the model's top-1
prediction is the gold token (where greedy decoding would have produced it), a head hits when its
argmax key is a needle position holding that token. Its score is hits / counted positions, over
every prompt; the reference is the chance that a key drawn uniformly from the visible ones is
such a position. Intervals resample needles (all placements of one needle together).

Needle accuracy is the share of prompts whose whole answer the model predicts top-1 (exactly
when greedy decoding reproduces it); the answer loss is the mean next-token loss on the answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headscope import capture
from headscope.data.circuits import NeedleItem, RetrievalSet, load_haystack, load_retrieval
from headscope.data.prompts import builtin, display_path
from headscope.detectors.circuits import RetrievalDetector
from headscope.errors import InputError, elide
from headscope.extend.base import ProgressFactory, Report, pad_token_of, prompt_set_report
from headscope.extend.checks import Check, one_check, too_many
from headscope.extend.protocol import (
    HELP_ABLATION,
    HELP_DRAWS,
    Analysis,
    Outcome,
    Output,
    Stats,
    check_common,
    option,
    register,
)
from headscope.models import LoadedModel
from headscope.verdicts.heads import random_control, top_heads
from headscope.verdicts.roles import RoleRule
from headscope.verdicts.stats import check_resamples

from .retrieval_present import needle_png

Head = tuple[int, int]
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)

TEMPLATES = {
    "en": ("{haystack}\n\nQuestion: {question}\nAnswer: ", " "),
    "zh": ("{haystack}\n\n问题：{question}\n回答：", ""),
}


def _parts(option: str, text: str, example: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise InputError(f"{option} {elide(text)}: the list is empty", hint=f"give e.g. {option} {example}")
    return parts


def _refuse_repeats(option: str, text: str, parts: list[str], values: Sequence[float]) -> None:
    """A repeated value would score the same prompts twice and narrow the intervals: refused."""
    first: dict[float, str] = {}
    for part, value in zip(parts, values, strict=True):
        if value in first:
            again = part if part == first[value] else f"{part} (= {first[value]})"
            raise InputError(
                f"{option} {elide(text)}: {elide(again)} is given twice",
                hint="each value once; a repeat would count the same prompts twice",
            )
        first[value] = part


def parse_contexts(text: str, option: str = "--context") -> tuple[int, ...]:
    parts = _parts(option, text, "1000,2000")
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        raise InputError(f"{option} {elide(text)}: expected token counts such as 1000 or 1000,2000") from None
    if any(v < 64 for v in values):
        raise InputError(f"{option} {elide(text)}: each context must be at least 64 tokens")
    _refuse_repeats(option, text, parts, values)
    return values


def parse_depths(text: str) -> tuple[float, ...]:
    parts = _parts("--depths", text, "0,0.25,0.5,0.75,1")
    try:
        values = tuple(float(part) for part in parts)
    except ValueError:
        raise InputError(f"--depths {elide(text)}: expected fractions such as 0,0.25,0.5,0.75,1") from None
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise InputError(f"--depths {elide(text)}: every depth must lie between 0 and 1 (0 = start, 1 = end)")
    _refuse_repeats("--depths", text, parts, values)
    return values


def language_of(needles: RetrievalSet) -> str:
    """ "zh" when most needles are Chinese, else "en": which shipped haystack suits them."""
    chinese = sum(_lang(item) == "zh" for item in needles.items)
    return "zh" if chinese * 2 > len(needles.items) else "en"


def _lang(item: NeedleItem) -> str:
    if item.lang is not None:
        return "zh" if item.lang.lower().startswith("zh") else "en"
    return "zh" if any(ord(ch) >= 0x2E80 for ch in item.needle) else "en"


@dataclass
class NeedlePrompt:
    needle: int  # index of the needle in the set
    context: int  # asked-for length
    depth: float
    ids: list[int]
    special: list[bool]
    queries: list[int]  # positions whose next token is an answer token
    gold: list[int]  # that token
    needle_keys: list[list[int]]  # per query: needle positions holding the gold token


def build_prompts(
    loaded: LoadedModel,
    needles: RetrievalSet,
    haystack: Sequence[str],
    contexts: Sequence[int],
    depths: Sequence[float],
    *,
    seed: int = 0,
) -> list[NeedlePrompt]:
    """Every needle at every context length and depth."""
    tokenizer = loaded.tokenizer
    limit = loaded.max_positions
    for context in contexts:
        if limit is not None and context > limit:
            raise InputError(f"--context {context} is longer than the model's context of {limit} tokens")
    lengths = [len(tokenizer(" " + s, add_special_tokens=False)["input_ids"]) for s in haystack]
    rng = random.Random(seed)
    starts = [rng.randrange(len(haystack)) for _ in needles.items]
    prompts = []
    for index, item in enumerate(needles.items):
        template, joiner = TEMPLATES[_lang(item)]
        tail = (
            template.split("{haystack}")[1].format(question=item.question) + item.answer_prefix + item.answer
        )
        overhead = len(tokenizer(joiner + item.needle + tail, add_special_tokens=True)["input_ids"])
        for context in contexts:
            budget = context - overhead
            chosen: list[str] = []
            used, position = 0, starts[index]
            while len(chosen) < 100_000:
                size = lengths[position % len(haystack)]
                if used + size > budget:
                    break
                chosen.append(haystack[position % len(haystack)])
                used += size
                position += 1
            if len(chosen) < 2:
                raise InputError(
                    f"--context {context} is too short: needle '{item.id}' with its question takes {overhead} tokens",
                    hint="use a longer context",
                )
            for depth in depths:
                cut = round(depth * len(chosen))
                before = joiner.join(chosen[:cut])
                after = joiner.join(chosen[cut:])
                lead = before + joiner if before else ""
                needle_start = len(lead)
                hay = lead + item.needle + (joiner + after if after else "")
                text = (
                    template.format(haystack=hay, question=item.question) + item.answer_prefix + item.answer
                )
                prompts.append(_encode(loaded, text, item, index, context, depth, needle_start))
    return prompts


def _encode(
    loaded: LoadedModel,
    text: str,
    item: NeedleItem,
    index: int,
    context: int,
    depth: float,
    needle_start: int,
) -> NeedlePrompt:
    enc = loaded.tokenizer(
        text, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True
    )
    ids = list(enc["input_ids"])
    special = [bool(s) for s in enc["special_tokens_mask"]]
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    limit = loaded.max_positions
    if limit is not None and len(ids) > limit:
        raise InputError(
            f"--context {context}: the prompt is {len(ids)} tokens, longer than the model's {limit}"
        )

    def inside(start: int, end: int) -> list[int]:
        return [i for i, (a, b) in enumerate(offsets) if not special[i] and b > a and a < end and start < b]

    answer_tokens = [i for i in inside(len(text) - len(item.answer), len(text)) if i >= 1]
    needle_tokens = inside(needle_start, needle_start + len(item.needle))
    queries = [i - 1 for i in answer_tokens]
    gold = [ids[i] for i in answer_tokens]
    needle_keys = [[k for k in needle_tokens if ids[k] == token] for token in gold]
    return NeedlePrompt(index, context, depth, ids, special, queries, gold, needle_keys)


@dataclass
class NeedleOutcome:
    """Needle accuracy and answer loss, overall and per (context, depth)."""

    n: int
    accuracy: float
    answer_loss: float
    cells: list[dict[str, Any]]  # context, depth, n, correct, accuracy, mean_tokens
    counted: int  # answer positions predicted right (the retrieval score's n)
    answer_tokens: int
    per_prompt: list[bool] = field(repr=False, default_factory=list)
    prompts: list[NeedlePrompt] = field(repr=False, default_factory=list)
    per_prompt_loss: list[float] = field(repr=False, default_factory=list)  # mean answer loss per prompt

    def print_to(self, console: Any, top: int = 10) -> None:
        """Above a retrieval table: needle accuracy and the grid by context and depth."""
        from .retrieval_present import print_needles

        print_needles(self, console)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "retrieval",
            "n": self.n,
            "accuracy": self.accuracy,
            "answer_loss": self.answer_loss,
            "counted_positions": self.counted,
            "answer_tokens": self.answer_tokens,
            "cells": self.cells,
        }


def _measure(
    loaded: LoadedModel,
    prompts: list[NeedlePrompt],
    batches: list[capture.Batch],
    detector: RetrievalDetector | Any | None,  # anything with update() and settle()
    ablation: capture.Ablation | None = None,
    progress: ProgressFactory | None = None,
    label: str = "",
    streaming: capture.StreamingHeads | None = None,
) -> NeedleOutcome:
    correct_all = [False] * len(prompts)
    loss_sum, loss_count, counted = 0.0, 0, 0
    prompt_losses = [0.0] * len(prompts)
    advance = progress(label, len(prompts)) if progress else None

    def on_hidden(hidden: torch.Tensor, batch: capture.Batch) -> None:
        nonlocal loss_sum, loss_count, counted
        correct: dict[tuple[int, int], bool] = {}
        for row, meta in enumerate(batch.meta):
            queries = torch.as_tensor(meta["queries"], dtype=torch.long, device=hidden.device)
            logits = capture.output_logits(loaded, hidden[row, queries])
            gold = torch.as_tensor(meta["gold"], dtype=torch.long, device=logits.device)
            hit = (logits.argmax(-1) == gold).cpu()
            losses = torch.logsumexp(logits, -1) - logits.gather(-1, gold[:, None])[:, 0]
            loss_sum += float(losses.double().sum())
            prompt_losses[meta["prompt"]] = float(losses.double().mean())
            loss_count += len(gold)
            counted += int(hit.sum())
            correct_all[meta["prompt"]] = bool(hit.all())
            for query, ok in zip(meta["queries"], hit.tolist(), strict=True):
                correct[(row, query)] = ok
        if detector is not None:
            detector.settle(batch, correct)

    attention = capture.Attention(detector.update, rows=detector.reads) if detector is not None else None
    capture.run(
        loaded,
        batches,
        capture.Pass(
            reads=[attention, capture.FinalHidden(on_hidden)],
            edits=[ablation, streaming],
            on_batch_done=(lambda b: advance(len(b.example_index))) if advance else None,
        ),
    )
    cells = []
    for key in dict.fromkeys((p.context, p.depth) for p in prompts):
        members = [i for i, p in enumerate(prompts) if (p.context, p.depth) == key]
        right = sum(correct_all[i] for i in members)
        cells.append(
            {
                "context": key[0],
                "depth": key[1],
                "n": len(members),
                "correct": right,
                "accuracy": right / len(members),
                "mean_tokens": sum(len(prompts[i].ids) for i in members) / len(members),
            }
        )
    return NeedleOutcome(
        len(prompts),
        sum(correct_all) / max(1, len(prompts)),
        loss_sum / max(1, loss_count),
        cells,
        counted,
        loss_count,
        correct_all,
        prompts,
        prompt_losses,
    )


def needle_batches(loaded: LoadedModel, prompts: list[NeedlePrompt], batch_size: int) -> list[capture.Batch]:
    meta = [
        {"prompt": i, "queries": p.queries, "gold": p.gold, "needle_keys": p.needle_keys}
        for i, p in enumerate(prompts)
    ]
    batches = capture.make_batches(
        [p.ids for p in prompts],
        [p.special for p in prompts],
        batch_size=batch_size,
        pad_id=pad_token_of(loaded),
        is_causal=loaded.is_causal,
        meta=meta,
    )
    for batch in batches:  # scores are kept per needle: all its placements are one example
        batch.example_index = torch.as_tensor(
            [prompts[m["prompt"]].needle for m in batch.meta], dtype=torch.long
        )
    return batches


def retrieval(
    loaded: LoadedModel,
    needles: RetrievalSet,
    haystack: Sequence[str],
    *,
    contexts: Sequence[int] = (1000,),
    depths: Sequence[float] = DEFAULT_DEPTHS,
    batch_size: int = 2,
    n_resamples: int = 1000,
    seed: int = 0,
    data: str | None = None,
    role_rule: RoleRule | None = None,
    progress: ProgressFactory | None = None,
) -> tuple[Report, NeedleOutcome, list[NeedlePrompt], list[capture.Batch]]:
    if not (loaded.is_causal and loaded.has_lm_head):
        raise InputError(
            "retrieval reads the model's next-token predictions, so it needs a causal language model"
        )
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    check_resamples(n_resamples)
    data = data or needles.name
    prompts = build_prompts(loaded, needles, haystack, contexts, depths, seed=seed)
    contexts_text = ",".join(str(c) for c in contexts)
    description = f"{display_path(needles.path)} ({len(needles.items)} needles x {len(depths)} depths at {contexts_text} tokens)"
    report, outcome, batches = score_prompts(
        loaded,
        prompts,
        len(needles.items),
        data,
        description,
        batch_size=batch_size,
        n_resamples=n_resamples,
        seed=seed,
        role_rule=role_rule,
        progress=progress,
    )
    return report, outcome, prompts, batches


def score_prompts(
    loaded: LoadedModel,
    prompts: list[NeedlePrompt],
    n_needles: int,
    data: str,
    description: str,
    *,
    batch_size: int = 2,
    n_resamples: int = 1000,
    seed: int = 0,
    role_rule: RoleRule | None = None,
    progress: ProgressFactory | None = None,
) -> tuple[Report, NeedleOutcome, list[capture.Batch]]:
    """Score every head on ready-made needle prompts (one forward pass each, teacher-forced)."""
    batches = needle_batches(loaded, prompts, batch_size)
    detector = RetrievalDetector()
    detector.start(loaded.layout, n_needles)
    outcome = _measure(loaded, prompts, batches, detector, progress=progress, label=data)
    notes = []
    if outcome.counted == 0:
        notes.append(f"{data}: the model predicted no answer token right, so no head could be scored")
    report = prompt_set_report(
        loaded,
        detector.results(data),
        data,
        description,
        notes,
        batches,
        n_resamples,
        seed,
        role_rule=role_rule,
        outcomes={data: outcome},
    )
    return report, outcome, batches


@dataclass
class RetrievalAblation:
    mode: str
    heads: list[Head]
    random_heads: list[list[Head]]
    clean: NeedleOutcome
    ablated: NeedleOutcome
    random: list[NeedleOutcome]
    data: str = ""

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope retrieval --verify``)."""
        from .retrieval_present import print_retrieval_ablation

        print_retrieval_ablation(self, console)

    def to_json(self) -> dict[str, Any]:
        def one(o: NeedleOutcome) -> dict[str, float]:
            return {"accuracy": o.accuracy, "answer_loss": o.answer_loss}

        return {
            "data": self.data,
            "mode": self.mode,
            "heads": [list(h) for h in self.heads],
            "random_heads": [[list(h) for h in d] for d in self.random_heads],
            "clean": one(self.clean),
            "ablated": one(self.ablated),
            "random": [one(o) for o in self.random],
        }


def ablate_retrieval(
    loaded: LoadedModel,
    prompts: list[NeedlePrompt],
    batches: list[capture.Batch],
    heads: Sequence[Head],
    clean: NeedleOutcome,
    *,
    mode: str = "zero",
    draws: int = 3,
    seed: int = 0,
    progress: ProgressFactory | None = None,
    data: str = "",
) -> RetrievalAblation:
    """Needle accuracy and answer loss with the top heads ablated, and with random same-layer heads."""
    if mode not in {"zero", "mean"}:
        raise InputError(f"--ablation must be zero or mean, got {mode!r}")
    rng = random.Random(seed)
    controls = [random_control(list(heads), loaded.layout, rng) for _ in range(draws)]
    means = None
    if mode == "mean":
        means = capture.head_output_means(loaded, batches, [*heads, *(h for c in controls for h in c)])
    ablated = _measure(
        loaded, prompts, batches, None, capture.Ablation.of(heads, mode, means), progress, "ablate top"
    )
    random_runs = [
        _measure(
            loaded,
            prompts,
            batches,
            None,
            capture.Ablation.of(c, mode, means),
            progress,
            f"ablate random {i + 1}",
        )
        for i, c in enumerate(controls)
    ]
    return RetrievalAblation(mode, list(heads), controls, clean, ablated, random_runs, data)


# --- the needle options and inputs (retrieval and kv-plan) --------------------------------------------


@dataclass(kw_only=True)
class Needles:
    """The needle prompts' data, for retrieval and kv-plan."""

    data: str | Path | None = option(
        None,
        "Needles, YAML or JSONL: needle, question, answer (default: the shipped English set).",
        cli_type=Path | None,
    )
    haystack: str | Path | None = option(
        None,
        "Filler text: .txt, or .conllu (its # text lines). Default: the shipped one for the needles' language.",
        cli_type=Path | None,
    )


@dataclass(frozen=True)
class NeedleInputs:
    """The needle set (its first ``--needles``, when set), the haystack, contexts and depths."""

    needles: RetrievalSet
    haystack: list[str]
    contexts: tuple[int, ...]
    depths: tuple[float, ...]


def _needle_inputs(
    options: Any, check_contexts: Callable[[tuple[int, ...]], None] | None = None
) -> NeedleInputs:
    """Contexts, depths, the needle set (its first ``options.needles``, when set) and the haystack,
    read and checked before the model loads; ``check_contexts(contexts)`` runs before any file is read."""
    contexts = parse_contexts(_joined(options.context))
    depths = parse_depths(_joined(options.depths))
    if check_contexts is not None:
        check_contexts(contexts)
    needle_set = load_retrieval(options.data if options.data is not None else builtin("retrieval/en.yaml"))
    if options.needles:
        needle_set.items = needle_set.items[: options.needles]
    haystack = options.haystack
    if haystack is None:
        haystack = builtin(f"retrieval/haystack-{language_of(needle_set)}.txt")
    return NeedleInputs(
        needles=needle_set, haystack=load_haystack(haystack), contexts=contexts, depths=depths
    )


def _joined(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else ",".join(str(v) for v in ([value] if not isinstance(value, list | tuple) else value))
    )


# --- the analysis: options, check, run, verify, JSON ------------------------------------------------


@dataclass(kw_only=True)
class RetrievalOptions(Needles, Stats):
    context: str | int | list[int] = option(
        "1000", "Prompt lengths in tokens, comma-separated (e.g. 1000,2000).", cli_type=str
    )
    depths: str | list[float] = option(
        "0,0.25,0.5,0.75,1",
        "Where the needle goes: fractions of the context, 0 = start, 1 = end.",
        cli_type=str,
    )
    needles: int | None = option(None, "Use only the first N needles (default: all).", min=1)
    ablate: int = option(0, "Ablate the top-K retrieval heads and K random same-layer heads.", min=0)
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(3, HELP_DRAWS, min=1)
    batch_size: int = option(2, "Prompts per forward pass.", min=1)


@register
class Retrieval(Analysis):
    name = "retrieval"
    summary = (
        "Needle in a haystack: needle accuracy by context and depth, and the heads that copy the needle."
    )
    options = RetrievalOptions
    takes_capture = False
    outputs = (
        Output("--png", "Draw needle accuracy by context and depth into this PNG.", needle_png, first=True),
    )

    def check(self, options: RetrievalOptions) -> NeedleInputs:
        check_common(options)
        return _needle_inputs(options)

    def check_loaded(self, loaded: Any, options: RetrievalOptions) -> None:
        if options.ablate:
            too_many(loaded, options.ablate, "ablate", "a random control")

    def run(self, loaded: Any, options: RetrievalOptions, prepared: NeedleInputs, progress: Any) -> Outcome:
        if not (loaded.is_causal and loaded.has_lm_head):
            raise InputError(
                f"{loaded.name} is not a causal language model; retrieval reads its next-token predictions"
            )
        report, outcome, prompts, batches = retrieval(
            loaded,
            prepared.needles,
            prepared.haystack,
            contexts=prepared.contexts,
            depths=prepared.depths,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        state = {"needle": outcome, "prompts": prompts, "batches": batches, "title": prepared.needles.name}
        return Outcome(report, state=state)

    def wants_verify(self, options: RetrievalOptions) -> bool:
        return options.ablate > 0

    def verify(
        self, loaded: Any, outcome: Outcome, options: RetrievalOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        too_many(loaded, k or options.ablate or 3, "k" if k else "ablate", "a random control")
        k = k or options.ablate or 3
        heads = top_heads(outcome.report.table, "retrieval", k)
        state = outcome.state
        effect = ablate_retrieval(
            loaded,
            state["prompts"],
            state["batches"],
            heads,
            state["needle"],
            mode=options.ablation,
            draws=options.draws,
            seed=options.seed,
            progress=progress,
        )
        return [Check("retrieval", effect)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"ablation": one_check(outcome, "retrieval")}
