"""``weights``: head roles read from the OV circuits alone (copying, copy suppression, successor heads).

No prompts and no attention: each head's OV circuit is read on a seeded sample of ordinary tokens
and on ordinal tasks. The scores become ordinary rows of the results table (detector ``weights``),
with bootstrap intervals over tokens (task pairs) and the role rule of every other table.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headscope import capture
from headscope.data.ordinal import OrdinalSet, load_ordinal
from headscope.data.prompts import builtin, display_path
from headscope.detectors.base import DetectorResult
from headscope.errors import InputError, NotApplicable
from headscope.extend.base import ProgressFactory, Report, pad_token_of, prompt_set_report
from headscope.extend.checks import Check
from headscope.extend.protocol import (
    HELP_ABLATION,
    HELP_DRAWS,
    Analysis,
    Outcome,
    Stats,
    check_common,
    option,
    register,
)
from headscope.models import LoadedModel
from headscope.verdicts.heads import random_control
from headscope.verdicts.roles import RoleRule
from headscope.verdicts.stats import check_resamples
from headscope.weightroles.ov import (
    Candidates,
    Circuits,
    Embedding,
    check_embedding,
    eigen_score,
    ordinary_ids,
    rank_tests,
    successor_hits,
)
from headscope.weightroles.summaries import SUMMARIES
from headscope.weightroles.tasks import ResolvedTask, check_distinct_sets, continuation_prompts, resolve_tasks

DEFAULT_TASK_SETS = ("ordinal/en.yaml", "ordinal/zh.yaml")
DEFAULT_EMBEDDING: Embedding = "mlp0"
VOCAB_DATA = "vocab"


@dataclass
class TaskCount:
    data: str
    task: str
    form: str
    qualified: int
    total: int
    pairs: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class WeightOutcome:
    """Model-level facts of one weights run."""

    embedding: str
    k: int
    tokens: int
    candidates: int
    seed: int
    tasks: list[TaskCount] = field(default_factory=list)
    seconds: float = 0.0
    resolved: dict[str, list[ResolvedTask]] = field(default_factory=dict, repr=False)
    langs: dict[str, str] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "embedding": self.embedding,
            "k": self.k,
            "tokens": self.tokens,
            "candidates": self.candidates,
            "baseline": self.k / self.candidates,
            "seed": self.seed,
            "seconds": self.seconds,
            "tasks": [t.to_json() for t in self.tasks],
        }

    def caption(self, section: Any) -> str | None:
        """The line under a weights table (the report asks every outcome); None for other tables."""
        from .weights_present import weights_caption

        return weights_caption(section, self) if section.detector == "weights" else None


def check_options(tokens: int, k: int, embedding: str) -> None:
    if tokens < 1:
        raise InputError(f"--tokens must be at least 1, got {tokens}")
    if k < 1:
        raise InputError(f"--k must be at least 1, got {k}")
    check_embedding(embedding)


def load_task_sets(paths: Sequence[str | Path] | None) -> list[OrdinalSet]:
    chosen = list(paths) if paths else [builtin(name) for name in DEFAULT_TASK_SETS]
    return [load_ordinal(p) for p in chosen]


def weights(
    loaded: LoadedModel,
    *,
    tokens: int = 2000,
    k: int = 5,
    embedding: str = DEFAULT_EMBEDDING,
    task_sets: Sequence[OrdinalSet] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    role_rule: RoleRule | None = None,
    progress: ProgressFactory | None = None,
) -> Report:
    """Score every head's OV circuit: copying, suppression, eigenvalue copying and successor."""
    check_options(tokens, k, embedding)
    check_resamples(n_resamples)
    if loaded.has_lm_head:  # without one, Circuits says so as bad input
        capture.checks.require(loaded, "dla", "ov")
    started = time.perf_counter()
    task_sets = list(task_sets) if task_sets is not None else load_task_sets(None)
    circuits = Circuits(loaded)
    layout = loaded.layout
    candidates = ordinary_ids(loaded)
    if len(candidates) < k + 1:
        raise InputError(f"--k {k} is not below the {len(candidates)} ordinary tokens of the vocabulary")
    generator = torch.Generator().manual_seed(seed)
    n_tokens = min(tokens, len(candidates))
    sample = candidates[torch.randperm(len(candidates), generator=generator)[:n_tokens]]

    resolved = {s.name: resolve_tasks(s, loaded.tokenizer) for s in task_sets}
    counts: list[TaskCount] = []
    pair_sources: dict[str, list[int]] = {}
    pair_tasks: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
    pair_baselines: dict[str, list[float]] = {}
    for name, tasks in resolved.items():
        sources: list[int] = []
        per_task = []
        baselines: list[float] = []
        for task in tasks:
            pairs = task.pairs()
            counts.append(TaskCount(name, task.name, task.form, task.size, len(task.members), len(pairs)))
            if not pairs or task.size < 2:
                continue
            tokens_of_task = [task.token_ids[i] for i in task.qualified]
            rows = torch.arange(len(sources), len(sources) + len(pairs))
            successor = torch.tensor([tokens_of_task.index(nxt) for _, nxt in pairs])
            sources += [src for src, _ in pairs]
            per_task.append((rows, torch.tensor(tokens_of_task), successor))
            baselines += [1.0 / task.size] * len(pairs)
        pair_sources[name], pair_tasks[name], pair_baselines[name] = sources, per_task, baselines

    all_sources = [i for s in pair_sources.values() for i in s]
    ids = torch.cat([sample, torch.tensor(all_sources, dtype=torch.long)])
    raw, effective = circuits.embeddings(ids, embedding)  # type: ignore[arg-type]

    n_layers, n_heads, group = layout.n_layers, layout.n_heads, layout.group_size
    top = torch.zeros(n_tokens, n_layers, n_heads, dtype=torch.float64)
    bottom = torch.zeros_like(top)
    eigen = torch.zeros(1, n_layers, n_heads, dtype=torch.float64)
    hits = {
        name: torch.zeros(len(s), n_layers, n_heads, dtype=torch.float64) for name, s in pair_sources.items()
    }
    unembed = circuits.unembed
    own_rows = unembed[sample]
    rivals = Candidates.of(candidates, unembed, generator)
    attending = layout.attention_layers  # a hybrid's other layers have no heads (dropped from the table)
    advance = progress("weights", len(attending)) if progress else None
    for index in attending:
        layer = circuits.layer(index)
        inputs = circuits.layer_inputs(layer, index, raw, effective)  # [N + P, D]
        values = layer.values(inputs)  # [kv, N + P, Dv]
        w_v = layer.w_v
        gram = inputs[:n_tokens].double().T @ own_rows.double()  # [D, D] = X^T W
        for head in range(n_heads):
            g = head // group
            w_o = layer.w_o[head]
            v_sample = values[g, :n_tokens]
            in_top, in_bottom = rank_tests(v_sample, w_o, own_rows, sample, rivals, k)
            top[:, index, head] = in_top.double()
            bottom[:, index, head] = in_bottom.double()
            # MLA's value path runs through a norm, so it has no W_V matrix and no eigenvalues.
            eigen[0, index, head] = eigen_score(w_v[g], w_o, gram) if w_v is not None else math.nan
            offset = n_tokens
            for name, per_task in pair_tasks.items():
                n_pairs = len(pair_sources[name])
                if n_pairs:
                    v_pairs = values[g, offset : offset + n_pairs]
                    hits[name][:, index, head] = successor_hits(v_pairs, w_o, unembed, per_task).double()
                offset += n_pairs
        if advance:
            advance(1)

    baseline = k / len(candidates)
    ones = torch.ones(n_tokens, dtype=torch.float64)
    vocab_base = torch.full((n_tokens,), baseline, dtype=torch.float64)
    notes: list[str] = []
    results = [
        DetectorResult("weights", "copying", "", top, ones, vocab_base, "top-k", VOCAB_DATA),
        DetectorResult(
            "weights", "suppression", "", bottom, ones.clone(), vocab_base.clone(), "bottom-k", VOCAB_DATA
        ),
    ]
    if bool(eigen.isnan().any()):
        notes.append(
            "eigenvalue: not scored: the value path runs through a norm (latent attention), so no head "
            "has a W_V matrix"
        )
    else:
        results.append(
            DetectorResult(
                "weights",
                "eigenvalue",
                "",
                eigen * n_tokens,
                torch.tensor([float(n_tokens)], dtype=torch.float64),
                torch.zeros(1, dtype=torch.float64),
                "random-matrix",
                VOCAB_DATA,
                interval=False,
            )
        )
    for name in pair_sources:
        if not pair_sources[name]:
            notes.append(
                f"{name}: no task has two consecutive members that are single tokens; no successor score"
            )
            continue
        results.append(
            DetectorResult(
                "weights",
                "successor",
                "",
                hits[name],
                torch.ones(len(pair_sources[name]), dtype=torch.float64),
                torch.tensor(pair_baselines[name], dtype=torch.float64),
                "chance",
                name,
            )
        )
    outcome = WeightOutcome(
        embedding,
        k,
        n_tokens,
        len(candidates),
        seed,
        counts,
        time.perf_counter() - started,
        resolved,
        {s.name: s.lang for s in task_sets},
    )
    description = (
        f"{n_tokens:,} tokens sampled (seed {seed}) from {len(candidates):,} ordinary ids, "
        f"{embedding} embedding, k = {k}"
    )
    report = prompt_set_report(
        loaded,
        results,
        VOCAB_DATA,
        description,
        notes,
        [],
        n_resamples,
        seed,
        role_rule=role_rule,
        outcomes={VOCAB_DATA: outcome},
    )
    report.inputs = {}
    for section in report.sections:
        if section.relation == "successor":
            set_ = next(s for s in task_sets if s.name == section.data)
            qualified = [c for c in counts if c.data == section.data]
            section.description = (
                f"{display_path(set_.path)} ({sum(c.pairs for c in qualified)} successor pairs in "
                f"{sum(1 for c in qualified if c.pairs)} tasks), {embedding} embedding"
            )
    return report


# --- --verify: ablate successor heads on ordinal continuation prompts -----------------------------------


@dataclass
class ContinuationOutcome:
    n: int
    accuracy: float
    loss: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SuccessorAblation:
    data: str
    mode: str
    heads: list[tuple[int, int]]
    random_heads: list[list[tuple[int, int]]]
    clean: ContinuationOutcome
    ablated: ContinuationOutcome
    random: list[ContinuationOutcome]

    def print_to(self, console: Any, top: int = 10) -> None:
        """This check for people (``headscope weights --verify``)."""
        from .weights_present import print_successor_ablation

        print_successor_ablation(self, console)

    def to_json(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "mode": self.mode,
            "heads": [list(h) for h in self.heads],
            "random_heads": [[list(h) for h in d] for d in self.random_heads],
            "clean": self.clean.to_json(),
            "ablated": self.ablated.to_json(),
            "random": [o.to_json() for o in self.random],
        }


SEPARATORS = {"zh": "、"}  # between members in continuation prompts; "," elsewhere


def _continuations(
    loaded: LoadedModel, tasks: Sequence[ResolvedTask], lang: str = "en"
) -> tuple[list[list[int]], list[list[bool]], list[int]]:
    """Prompts of three consecutive members, each followed by a separator ("Monday, Tuesday,
    Wednesday," → " Thursday"; "一、二、三、" → "四"), after the special tokens the tokenizer itself
    puts first; the fourth member is the target, in the task's form."""
    tokenizer = loaded.tokenizer
    special = set(tokenizer.all_special_ids)
    prefix: list[int] = []
    for token in tokenizer("a", add_special_tokens=True)["input_ids"]:
        if token not in special:
            break
        prefix.append(int(token))
    separator = list(tokenizer(SEPARATORS.get(lang, ","), add_special_tokens=False)["input_ids"])
    contexts, specials, targets = [], [], []
    for task in tasks:
        for context, target in continuation_prompts(task):
            body = [piece for token in context for piece in (int(token), *separator)]
            contexts.append(prefix + body)
            specials.append([True] * len(prefix) + [False] * len(body))
            targets.append(int(target))
    return contexts, specials, targets


def _continue(
    loaded: LoadedModel,
    batches: list[capture.Batch],
    targets: list[int],
    ablation: capture.Ablation | None,
) -> ContinuationOutcome:
    hit = [False] * len(targets)
    loss = [0.0] * len(targets)

    def on_hidden(hidden: torch.Tensor, batch: capture.Batch) -> None:
        last = batch.attention_mask.sum(1) - 1
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        logits = capture.output_logits(loaded, hidden[rows, last.to(hidden.device)]).double()
        for row, example in enumerate(batch.example_index):
            target = targets[int(example)]
            hit[int(example)] = int(logits[row].argmax()) == target
            loss[int(example)] = float(torch.logsumexp(logits[row], -1) - logits[row, target])

    capture.run(loaded, batches, capture.Pass(reads=[capture.FinalHidden(on_hidden)], edits=[ablation]))
    n = len(targets)
    return ContinuationOutcome(n, sum(hit) / n, sum(loss) / n)


def verify_successor(
    loaded: LoadedModel,
    report: Report,
    data: str,
    *,
    k: int = 3,
    mode: str = "zero",
    draws: int = 3,
    seed: int = 0,
    batch_size: int = 16,
) -> SuccessorAblation | None:
    """Ablate the ``k`` best successor heads of ``data``, and random same-layer heads; measure the
    next-member accuracy and loss on continuation prompts ("Monday, Tuesday, Wednesday," → " Thursday")."""
    if mode not in {"zero", "mean"}:
        raise InputError(f"--ablation must be zero or mean, got {mode!r}")
    outcome = report.outcomes.get(VOCAB_DATA)
    if not isinstance(outcome, WeightOutcome) or data not in outcome.resolved:
        return None
    lang = outcome.langs.get(data, "en")
    contexts, specials, targets = _continuations(loaded, outcome.resolved[data], lang)
    if not contexts:
        return None
    table = report.table
    rows = table[(table.detector == "weights") & (table.relation == "successor") & (table.data == data)]
    rows = rows.sort_values("score", ascending=False).head(k)
    heads = [(int(r.layer), int(r.head)) for r in rows.itertuples()]
    if not heads:
        return None
    rng = random.Random(seed)
    controls = [random_control(heads, loaded.layout, rng) for _ in range(draws)]
    batches = capture.make_batches(
        contexts, specials, batch_size=batch_size, pad_id=pad_token_of(loaded), is_causal=loaded.is_causal
    )
    means = None
    if mode == "mean":
        means = capture.head_output_means(loaded, batches, [*heads, *(h for c in controls for h in c)])
    clean = _continue(loaded, batches, targets, None)
    ablated = _continue(loaded, batches, targets, capture.Ablation.of(heads, mode, means))
    randoms = [_continue(loaded, batches, targets, capture.Ablation.of(c, mode, means)) for c in controls]
    return SuccessorAblation(data, mode, heads, controls, clean, ablated, randoms)


# --- the analysis: options, check, run, verify, JSON ------------------------------------------------


@dataclass(kw_only=True)
class WeightsOptions(Stats):
    tokens: int = option(2000, "Ordinary tokens sampled (seeded) for the copying and suppression tests.")
    k: int = option(5, "Top-k (bottom-k) the own token must reach.")
    embedding: str = option(
        "mlp0", "What a head reads: mlp0 (effective embedding after block 0, the default) or raw."
    )
    tasks: list[Path] | None = option(
        None,
        "Ordinal task file(s), YAML (default: the shipped English and Chinese sets).",
        cli_type=list[Path] | None,
    )
    verify: bool = option(
        False,
        "Ablate the top successor heads and random same-layer heads on ordinal continuation prompts.",
    )
    verify_k: int = option(3, "Successor heads ablated by --verify.", min=1)
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(3, HELP_DRAWS, min=1)


@register
class Weights(Analysis):
    name = "weights"
    summary = "Roles from the weights alone: OV copying, copy suppression and successor heads (no prompts)."
    options = WeightsOptions
    sweepable = True
    takes_capture = False
    spaced_checks = True

    def check(self, options: WeightsOptions) -> list[OrdinalSet]:
        check_common(options)
        check_options(options.tokens, options.k, options.embedding)
        tasks = options.tasks
        if isinstance(tasks, str | Path):
            tasks = [tasks]
        task_sets = load_task_sets(tasks)
        check_distinct_sets(task_sets)
        return task_sets

    def run(self, loaded: Any, options: WeightsOptions, prepared: list[OrdinalSet], progress: Any) -> Outcome:
        if not loaded.has_lm_head:
            raise NotApplicable(
                f"{loaded.name} has no LM head: the OV token tests read logits through the unembedding, "
                "so there is nothing to score"
            )
        report = weights(
            loaded,
            tokens=options.tokens,
            k=options.k,
            embedding=options.embedding,
            task_sets=prepared,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(report, state={"tasks": [t.name for t in prepared]})

    def wants_verify(self, options: WeightsOptions) -> bool:
        return options.verify

    def verify(
        self, loaded: Any, outcome: Outcome, options: WeightsOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        checks = []
        for name in outcome.state["tasks"]:
            check = verify_successor(
                loaded,
                outcome.report,
                name,
                k=k or options.verify_k,
                mode=options.ablation,
                draws=options.draws,
                seed=options.seed,
            )
            if check is None:
                outcome.report.notes.append(f"--verify: {name}: no successor pairs to test")
            else:
                checks.append(Check("successor", check))
        return checks


__all__ = [
    "DEFAULT_EMBEDDING",
    "DEFAULT_TASK_SETS",
    "SUMMARIES",
    "SuccessorAblation",
    "WeightOutcome",
    "Weights",
    "WeightsOptions",
    "check_options",
    "load_task_sets",
    "verify_successor",
    "weights",
]
