"""What every analysis shares: the report types, batching, encoding, the repeated-token protocol."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from headscope import capture, detectors
from headscope.data.prompts import PromptSet
from headscope.detectors.base import Detector, DetectorResult
from headscope.errors import InputError
from headscope.models import HeadLayout, LoadedModel
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import RoleRule, assign_roles
from headscope.weightroles.summaries import SUMMARIES

# progress(label, total) returns advance(n); the CLI draws a bar with it, tests pass None.
ProgressFactory = Callable[[str, int], Callable[[int], None]]


@dataclass(frozen=True)
class RepeatSpec:
    """The repeated-random-tokens protocol: ``n_seqs`` sequences of ``seq_len`` random tokens,
    each repeated ``repeats`` times, optionally after a BOS token (None: when the model has one)."""

    seq_len: int = 50
    repeats: int = 2
    n_seqs: int = 16
    seed: int = 0
    bos: bool | None = None

    def validate(self) -> None:
        if self.seq_len < 2:
            raise InputError(
                f"--seq-len must be at least 2, got {self.seq_len}",
                hint="with one token per copy no token has a successor before its repeat, so there is "
                "nothing for induction to attend to",
            )
        if self.repeats < 2:
            raise InputError(
                f"--repeat-seq must be at least 2, got {self.repeats}",
                hint="a sequence needs a second copy for induction to act on",
            )
        if self.n_seqs < 1:
            raise InputError(f"--batch must be at least 1, got {self.n_seqs}")


@dataclass
class Section:
    """What one table is about: a (detector, relation, direction) and the data it was scored on."""

    detector: str
    relation: str
    direction: str
    summary: str
    data: str  # short name, as in the CSV's data column
    description: str  # what the data is, for people
    n: int
    n_examples: int
    baseline: float | None
    baseline_kind: str
    baseline_label: str = ""
    extras: dict[str, float] = field(default_factory=dict)
    # (lowest, highest) baseline over layers; they differ where layers' masks differ (sliding windows).
    baseline_range: tuple[float, float] | None = None


@dataclass
class CopyLoss:
    """Mean next-token loss per copy of the repeated sequences (copy 0 is the first)."""

    per_copy: list[float]
    tokens_per_copy: list[int]

    @property
    def first(self) -> float:
        return self.per_copy[0]

    @property
    def later(self) -> float:
        later_tokens = sum(self.tokens_per_copy[1:])
        weighted = zip(self.per_copy[1:], self.tokens_per_copy[1:], strict=True)
        return sum(loss * tokens for loss, tokens in weighted) / later_tokens


@dataclass
class Report:
    model: str
    table: pd.DataFrame
    sections: list[Section]
    capture_mode: str
    loss: CopyLoss | None = None
    notes: list[str] = field(default_factory=list)
    results: list[DetectorResult] = field(default_factory=list)
    # What each data name was scored on, kept for `--verify` (batches, and the repeat protocol).
    inputs: dict[str, list[capture.Batch]] = field(default_factory=dict, repr=False)
    repeat: tuple[RepeatSpec, int] | None = None  # (spec, offset of copy 0)
    layout: HeadLayout | None = None  # the role map marks global layers where layers differ
    # Model-level results of circuit analyses, by data name (IOIOutcome, NeedleOutcome).
    outcomes: dict[str, Any] = field(default_factory=dict)
    # Wall-clock seconds per step (scan: per data set), for --profile; not part of any output file.
    timings: dict[str, float] = field(default_factory=dict, repr=False)
    # Model-level numbers a sweep records beside the head tables (icl: the ICL score and its interval).
    measures: dict[str, float] = field(default_factory=dict)


def _summary(result: DetectorResult) -> str:
    found = detectors.declared(result.detector)
    if found is not None:
        return found.summary
    return SUMMARIES.get(result.relation, result.relation)


def report_sections(results: Sequence[DetectorResult], descriptions: dict[str, str]) -> list[Section]:
    return [
        Section(
            r.detector,
            r.relation,
            r.direction,
            _summary(r),
            r.data,
            descriptions.get(r.data, r.data),
            r.n,
            r.n_examples,
            r.baseline(),
            r.baseline_kind,
            r.baseline_label,
            dict(r.extras),
            r.baseline_range(),
        )
        for r in results
        if r.n > 0  # nothing counted: no table (head_table leaves it out; a note says why)
    ]


def score_batches(
    loaded: LoadedModel,
    batches: Sequence[capture.Batch],
    chosen: Sequence[Detector],
    n_examples: int,
    data_name: str,
    *,
    on_token_loss: Callable[[torch.Tensor, capture.Batch], None] | None = None,
    progress: ProgressFactory | None = None,
) -> list[DetectorResult]:
    """One streamed pass over ``batches``; every layer's attention goes to every detector."""
    for detector in chosen:
        detector.start(loaded.layout, n_examples)

    def on_layer(layer: int, attn: torch.Tensor, batch: capture.Batch, q_start: int) -> None:
        for detector in chosen:
            detector.update(layer, attn, batch, q_start)

    def on_layer_done(layer: int, batch: capture.Batch) -> None:
        for detector in chosen:
            detector.end_layer(layer, batch)

    def on_pairs(layer: int, found: list[capture.rows.PairWeights], batch: capture.Batch) -> None:
        # Only called when every detector read pairs: one part each, in order.
        for detector, part in zip(chosen, found, strict=True):
            detector.update_pairs(layer, part, batch)

    advance = progress(data_name, n_examples) if progress else None
    attention = capture.Attention(
        on_layer,
        rows=capture.rows.union([detector.reads for detector in chosen]),
        on_pairs=on_pairs,
        on_layer_done=on_layer_done,
    )
    losses = capture.TokenLosses(on_token_loss) if on_token_loss is not None else None
    capture.run(
        loaded,
        batches,
        capture.Pass(
            reads=[attention, losses],
            on_batch_done=(lambda b: advance(len(b.example_index))) if advance else None,
        ),
    )
    return [result for detector in chosen for result in detector.results(data_name)]


def model_batches(
    loaded: LoadedModel,
    sequences: Sequence[Sequence[int]],
    specials: Sequence[Sequence[bool]],
    batch_size: int,
    meta: Sequence[dict] | None = None,
) -> list[capture.Batch]:
    """Length-sorted, right-padded batches for this model."""
    return capture.make_batches(
        sequences,
        specials,
        batch_size=batch_size,
        pad_id=pad_token_of(loaded),
        is_causal=loaded.is_causal,
        meta=meta,
        tokenizer=loaded.tokenizer,
    )


def check_context(loaded: LoadedModel, length: int, what: str) -> None:
    """Reject an input of ``length`` tokens that does not fit the model's context."""
    limit = loaded.max_positions
    if limit is not None and length > limit:
        raise InputError(f"{what} is {length} tokens, longer than the model's context of {limit} tokens")


def encode_texts(loaded: LoadedModel, prompt_set: PromptSet) -> tuple[list[list[int]], list[list[bool]]]:
    """Tokenize with the tokenizer's own special tokens; reject empty or over-long items by file:line."""
    tokenizer = loaded.tokenizer
    sequences, specials = [], []
    for item in prompt_set.items:
        enc = tokenizer(item.text, add_special_tokens=True, return_special_tokens_mask=True)
        ids = list(enc["input_ids"])
        special = [bool(s) for s in enc["special_tokens_mask"]]
        if not ids or all(special):
            raise InputError(f"{item.source}: item '{item.id}' tokenizes to nothing")
        check_context(loaded, len(ids), f"{item.source}: item '{item.id}'")
        sequences.append(ids)
        specials.append(special)
    return sequences, specials


def pad_token_of(loaded: LoadedModel) -> int:
    tokenizer = loaded.tokenizer
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def repeated_tokens(loaded: LoadedModel, spec: RepeatSpec) -> tuple[list[list[int]], list[list[bool]], int]:
    """Build the protocol's sequences. Returns ids, special masks, and the offset of copy 0."""
    spec.validate()
    tokenizer = loaded.tokenizer
    vocab_size = min(len(tokenizer), loaded.model.get_input_embeddings().num_embeddings)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    special_ids = [i for i in tokenizer.all_special_ids if i is not None and i < vocab_size]
    allowed[special_ids] = False
    candidates = allowed.nonzero().squeeze(1)
    if len(candidates) < 2:
        raise InputError("the tokenizer has no ordinary tokens to sample from")
    generator = torch.Generator().manual_seed(spec.seed)
    draws = candidates[torch.randint(len(candidates), (spec.n_seqs, spec.seq_len), generator=generator)]

    prefix: list[int] = []
    suffix: list[int] = []
    use_bos = spec.bos if spec.bos is not None else True
    if use_bos:
        if loaded.is_causal and tokenizer.bos_token_id is not None:
            prefix = [int(tokenizer.bos_token_id)]
        elif not loaded.is_causal and tokenizer.cls_token_id is not None:
            prefix = [int(tokenizer.cls_token_id)]
            suffix = [int(tokenizer.sep_token_id)] if tokenizer.sep_token_id is not None else []
        elif spec.bos:
            raise InputError("--bos was asked for, but the tokenizer defines no BOS/CLS token")
    total = len(prefix) + spec.seq_len * spec.repeats + len(suffix)
    check_context(
        loaded, total, f"--seq-len {spec.seq_len} x --repeat-seq {spec.repeats} (with special tokens)"
    )
    sequences, specials = [], []
    for row in draws.tolist():
        body = row * spec.repeats
        sequences.append(prefix + body + suffix)
        specials.append([True] * len(prefix) + [False] * len(body) + [True] * len(suffix))
    return sequences, specials, len(prefix)


def detectors_for(source: str, names: Sequence[str] | None) -> list[Detector]:
    chosen = detectors.create(list(names) if names is not None else None)
    return [d for d in chosen if d.default_source == source]


def repeat_description(spec: RepeatSpec) -> str:
    return f"repeated random tokens ({spec.n_seqs} x {spec.seq_len} tokens x {spec.repeats})"


def prompt_set_report(
    loaded: LoadedModel,
    results: list[DetectorResult],
    data_name: str,
    description: str,
    notes: list[str],
    batches: list[capture.Batch],
    n_resamples: int,
    seed: int,
    *,
    role_rule: RoleRule | None = None,
    outcomes: dict[str, Any] | None = None,
) -> Report:
    """The report of one scored prompt set (syntax treebank, coreference set, needles)."""
    table = assign_roles(
        head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed), role_rule
    )
    return Report(
        loaded.name,
        table,
        report_sections(results, {data_name: description}),
        loaded.capture_mode,
        notes=notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs={data_name: batches},
        layout=loaded.layout,
        outcomes=outcomes or {},
    )


def score_prompt_set(
    loaded: LoadedModel,
    prompt_set: PromptSet,
    chosen: Sequence[Detector],
    *,
    batch_size: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    role_rule: RoleRule | None = None,
    progress: ProgressFactory | None = None,
) -> Report:
    """One prompt set through ``chosen`` detectors: encoded, batched, streamed, tabled with
    baselines, intervals and roles. The building block of an analysis' ``run`` (a plugin's too)."""
    sequences, specials = encode_texts(loaded, prompt_set)
    batches = model_batches(loaded, sequences, specials, batch_size)
    results = score_batches(loaded, batches, chosen, len(sequences), prompt_set.name, progress=progress)
    from headscope.data.prompts import display_path

    description = f"{display_path(prompt_set.path)} ({len(sequences)} texts)"
    return prompt_set_report(
        loaded, results, prompt_set.name, description, [], batches, n_resamples, seed, role_rule=role_rule
    )
