"""The core operations behind the CLI: ``scan`` and ``induction``. No typer, no printing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from . import capture, detectors
from .detectors.base import Detector, DetectorResult
from .errors import InputError
from .models import LoadedModel
from .prompts import PromptSet, builtin, load_texts
from .results import head_table

# progress(label, total) returns advance(n); the CLI draws a bar with it, tests pass None.
ProgressFactory = Callable[[str, int], Callable[[int], None]]

DEFAULT_TEXT_SET = "text/natural.yaml"


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
        if self.seq_len < 1:
            raise InputError(f"--seq-len must be at least 1, got {self.seq_len}")
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
    data: str
    n: int
    n_examples: int
    baseline: float | None
    baseline_kind: str


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


def _sections(results: Sequence[DetectorResult], found: Sequence[Detector]) -> list[Section]:
    summaries = {d.name: d.summary for d in found}
    return [
        Section(
            r.detector,
            r.relation,
            r.direction,
            summaries.get(r.detector, ""),
            r.data,
            r.n,
            r.n_examples,
            r.baseline(),
            r.baseline_kind,
        )
        for r in results
    ]


def score_batches(
    loaded: LoadedModel,
    batches: Sequence[capture.Batch],
    chosen: Sequence[Detector],
    n_examples: int,
    data_label: str,
    *,
    on_logits: Callable[[torch.Tensor, capture.Batch], None] | None = None,
    progress: ProgressFactory | None = None,
) -> list[DetectorResult]:
    """One streamed pass over ``batches``; every layer's attention goes to every detector."""
    for detector in chosen:
        detector.start(loaded.layout, n_examples)

    def on_layer(layer: int, attn: torch.Tensor, batch: capture.Batch) -> None:
        for detector in chosen:
            detector.update(layer, attn, batch)

    advance = progress(data_label, n_examples) if progress else None
    capture.run(
        loaded,
        batches,
        on_layer,
        on_logits=on_logits,
        on_batch_done=(lambda b: advance(len(b.example_index))) if advance else None,
    )
    return [result for detector in chosen for result in detector.results(data_label)]


def _check_context(loaded: LoadedModel, length: int, what: str) -> None:
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
        _check_context(loaded, len(ids), f"{item.source}: item '{item.id}'")
        sequences.append(ids)
        specials.append(special)
    return sequences, specials


def _pad_id(loaded: LoadedModel) -> int:
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
    _check_context(
        loaded, total, f"--seq-len {spec.seq_len} x --repeat-seq {spec.repeats} (with special tokens)"
    )
    sequences, specials = [], []
    for row in draws.tolist():
        body = row * spec.repeats
        sequences.append(prefix + body + suffix)
        specials.append([True] * len(prefix) + [False] * len(body) + [True] * len(suffix))
    return sequences, specials, len(prefix)


def _detectors_for(source: str, names: Sequence[str] | None) -> list[Detector]:
    chosen = detectors.create(list(names) if names is not None else None)
    return [d for d in chosen if d.default_source == source]


def scan(
    loaded: LoadedModel,
    *,
    text_set: str | Path | PromptSet | None = None,
    repeat: RepeatSpec | None = None,
    detector_names: Sequence[str] | None = None,
    batch_size: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: ProgressFactory | None = None,
) -> Report:
    """Run every head-level detector on the data it is defined on.

    Position detectors (previous-token, sink) read natural text; token-identity detectors
    (duplicate-token, induction) read repeated random tokens, where the right answer is known.
    """
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    repeat = repeat or RepeatSpec(seed=seed)
    if not isinstance(text_set, PromptSet):
        text_set = load_texts(text_set if text_set is not None else builtin(DEFAULT_TEXT_SET))
    prompt_set = text_set
    results: list[DetectorResult] = []
    used: list[Detector] = []

    text_detectors = _detectors_for("text", detector_names)
    if text_detectors:
        sequences, specials = encode_texts(loaded, prompt_set)
        batches = capture.make_batches(
            sequences, specials, batch_size=batch_size, pad_id=_pad_id(loaded), is_causal=loaded.is_causal
        )
        label = f"{prompt_set.name} ({len(sequences)} texts)"
        results += score_batches(loaded, batches, text_detectors, len(sequences), label, progress=progress)
        used += text_detectors

    token_detectors = _detectors_for("repeated-tokens", detector_names)
    if token_detectors:
        sequences, specials, _ = repeated_tokens(loaded, repeat)
        batches = capture.make_batches(
            sequences, specials, batch_size=batch_size, pad_id=_pad_id(loaded), is_causal=loaded.is_causal
        )
        label = f"repeated random tokens ({repeat.n_seqs} x {repeat.seq_len} tokens x {repeat.repeats})"
        results += score_batches(loaded, batches, token_detectors, len(sequences), label, progress=progress)
        used += token_detectors

    table = head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed)
    return Report(loaded.name, table, _sections(results, used), loaded.capture_mode)


class _CopyLossMeter:
    """Accumulates next-token loss by copy index from the logits of each batch."""

    def __init__(self, offset: int, seq_len: int, repeats: int) -> None:
        self.offset, self.seq_len, self.repeats = offset, seq_len, repeats
        self.loss_sum = torch.zeros(repeats, dtype=torch.float64)
        self.tokens = torch.zeros(repeats, dtype=torch.long)

    def __call__(self, logits: torch.Tensor, batch: capture.Batch) -> None:
        targets = batch.input_ids[:, 1:]
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].transpose(1, 2), targets, reduction="none"
        ).cpu()  # [B, T-1]: loss of predicting token t+1
        positions = torch.arange(1, batch.input_ids.shape[1])
        copy_index = (positions - self.offset).div(self.seq_len, rounding_mode="floor")
        in_body = (positions >= self.offset) & (copy_index < self.repeats)
        for copy in range(self.repeats):
            mask = in_body & (copy_index == copy)
            self.loss_sum[copy] += losses[:, mask].double().sum()
            self.tokens[copy] += int(mask.sum()) * losses.shape[0]

    def result(self) -> CopyLoss:
        per_copy = (self.loss_sum / self.tokens.clamp(min=1)).tolist()
        return CopyLoss(per_copy, self.tokens.tolist())


def induction(
    loaded: LoadedModel,
    spec: RepeatSpec,
    *,
    batch_size: int = 16,
    n_resamples: int = 1000,
    progress: ProgressFactory | None = None,
) -> Report:
    """The repeated-random-tokens protocol: induction and duplicate-token heads plus loss by copy."""
    spec.validate()
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    sequences, specials, offset = repeated_tokens(loaded, spec)
    batches = capture.make_batches(
        sequences, specials, batch_size=batch_size, pad_id=_pad_id(loaded), is_causal=loaded.is_causal
    )
    chosen = detectors.create(["induction", "duplicate-token"])
    meter = None
    notes = []
    if loaded.is_causal and loaded.has_lm_head:
        meter = _CopyLossMeter(offset, spec.seq_len, spec.repeats)
    else:
        notes.append("loss by copy not reported: the model is not a causal language model with an LM head")
    label = f"repeated random tokens ({spec.n_seqs} x {spec.seq_len} tokens x {spec.repeats})"
    results = score_batches(
        loaded, batches, chosen, len(sequences), label, on_logits=meter, progress=progress
    )
    table = head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=spec.seed)
    return Report(
        loaded.name,
        table,
        _sections(results, chosen),
        loaded.capture_mode,
        loss=meter.result() if meter else None,
        notes=notes,
    )
