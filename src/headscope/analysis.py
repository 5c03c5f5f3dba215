"""The core operations behind the CLI: ``scan`` and ``induction``. No typer, no printing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from . import capture, detectors
from .align import AlignmentError, encode_with_spans, precedes, share_a_token
from .conllu import Treebank, read_conllu
from .detectors.base import Detector, DetectorResult
from .detectors.coref import CorefDetector
from .detectors.syntax import DEFAULT_RELATIONS, SyntaxDetector
from .errors import InputError
from .models import LoadedModel
from .prompts import CorefSet, PromptSet, builtin, display_path, load_coref, load_texts
from .results import head_table, uncertainty_notes
from .roles import RoleRule, assign_roles
from .stats import check_resamples

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


def _sections(results: Sequence[DetectorResult], descriptions: dict[str, str]) -> list[Section]:
    return [
        Section(
            r.detector,
            r.relation,
            r.direction,
            detectors.REGISTRY[r.detector].summary,
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

    advance = progress(data_name, n_examples) if progress else None
    capture.run(
        loaded,
        batches,
        on_layer,
        on_layer_done=on_layer_done,
        on_token_loss=on_token_loss,
        on_batch_done=(lambda b: advance(len(b.example_index))) if advance else None,
    )
    return [result for detector in chosen for result in detector.results(data_name)]


def _batches(
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
        pad_id=_pad_id(loaded),
        is_causal=loaded.is_causal,
        meta=meta,
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
    check_context(
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


def _repeat_description(spec: RepeatSpec) -> str:
    return f"repeated random tokens ({spec.n_seqs} x {spec.seq_len} tokens x {spec.repeats})"


DEFAULT_TREEBANKS = ("syntax/en.conllu", "syntax/zh.conllu")
DEFAULT_COREF_SETS = ("coref/en.yaml", "coref/zh.yaml")


def scan(
    loaded: LoadedModel,
    *,
    text_set: str | Path | PromptSet | None = None,
    repeat: RepeatSpec | None = None,
    detector_names: Sequence[str] | None = None,
    batch_size: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    role_rule: RoleRule | None = None,
    progress: ProgressFactory | None = None,
) -> Report:
    """Run every detector on the data it is defined on.

    Position detectors (previous-token, sink) read natural text; token-identity detectors
    (duplicate-token, induction) read repeated random tokens, where the right answer is known;
    syntax and coreference read the shipped annotated English and Chinese sets.
    """
    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    check_resamples(n_resamples)
    repeat = repeat or RepeatSpec(seed=seed)
    if not isinstance(text_set, PromptSet):
        text_set = load_texts(text_set if text_set is not None else builtin(DEFAULT_TEXT_SET))
    prompt_set = text_set
    results: list[DetectorResult] = []
    descriptions: dict[str, str] = {}
    notes: list[str] = []
    inputs: dict[str, list[capture.Batch]] = {}
    repeat_info: tuple[RepeatSpec, int] | None = None

    text_detectors = _detectors_for("text", detector_names)
    if text_detectors:
        sequences, specials = encode_texts(loaded, prompt_set)
        batches = _batches(loaded, sequences, specials, batch_size)
        descriptions[prompt_set.name] = f"{display_path(prompt_set.path)} ({len(sequences)} texts)"
        inputs[prompt_set.name] = batches
        results += score_batches(
            loaded, batches, text_detectors, len(sequences), prompt_set.name, progress=progress
        )

    token_detectors = _detectors_for("repeated-tokens", detector_names)
    if token_detectors:
        sequences, specials, offset = repeated_tokens(loaded, repeat)
        batches = _batches(loaded, sequences, specials, batch_size)
        descriptions["repeated-tokens"] = _repeat_description(repeat)
        inputs["repeated-tokens"] = batches
        repeat_info = (repeat, offset)
        results += score_batches(
            loaded, batches, token_detectors, len(sequences), "repeated-tokens", progress=progress
        )

    for source, names, score_set in (
        ("treebank", DEFAULT_TREEBANKS, syntax),
        ("coref", DEFAULT_COREF_SETS, coref),
    ):
        if not _detectors_for(source, detector_names):
            continue
        for name in names:
            try:
                part = score_set(
                    loaded, builtin(name), batch_size=batch_size, n_resamples=0, progress=progress
                )
            except InputError as exc:
                # A shipped set this model's tokenizer cannot align (every arc inside one token,
                # say) is reported and left out; it does not stop the rest of the scan.
                notes.append(f"{name}: not scored: {exc}")
                continue
            results += part.results
            descriptions.update({s.data: s.description for s in part.sections})
            notes += part.notes
            inputs.update(part.inputs)

    table = assign_roles(
        head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed), role_rule
    )
    return Report(
        loaded.name,
        table,
        _sections(results, descriptions),
        loaded.capture_mode,
        notes=notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs=inputs,
        repeat=repeat_info,
    )


# --- syntax -------------------------------------------------------------------------------------


def _prompt_set_report(
    loaded: LoadedModel,
    results: list[DetectorResult],
    data_name: str,
    description: str,
    notes: list[str],
    batches: list[capture.Batch],
    n_resamples: int,
    seed: int,
) -> Report:
    """The report of one scored prompt set (syntax treebank or coreference set)."""
    table = assign_roles(head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=seed))
    return Report(
        loaded.name,
        table,
        _sections(results, {data_name: description}),
        loaded.capture_mode,
        notes=notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs={data_name: batches},
    )


def check_relations(treebank: Treebank, relations: Sequence[str] | None) -> list[str]:
    """The relations to score: the asked-for ones (each must occur), or the defaults that occur."""
    wanted = list(relations) if relations else list(DEFAULT_RELATIONS)
    present = {w.deprel for s in treebank.sentences for w in s.words if w.head >= 0}
    missing = [r for r in wanted if r not in present]
    if relations and missing:
        raise InputError(
            f"--relations: {', '.join(missing)} not found in {display_path(treebank.path)}",
            hint=f"relations there: {', '.join(sorted(present))}",
        )
    return [r for r in wanted if r in present]


def syntax(
    loaded: LoadedModel,
    treebank: str | Path | Treebank,
    *,
    relations: Sequence[str] | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
    batch_size: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: ProgressFactory | None = None,
) -> Report:
    """Score every head on every (relation, direction) of a CoNLL-U treebank."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    check_resamples(n_resamples)
    if not isinstance(treebank, Treebank):
        treebank = read_conllu(treebank, skip_bad=skip_bad, limit=limit)
    wanted = check_relations(treebank, relations)
    sequences, specials, metas = [], [], []
    too_long = unaligned = merged = 0
    for sentence in treebank.sentences:
        arcs = sentence.arcs(set(wanted))
        if not arcs:
            continue
        try:
            ids, special, to_word, from_word = encode_with_spans(
                loaded.tokenizer, sentence.text, [(w.start, w.end) for w in sentence.words]
            )
        except AlignmentError:
            unaligned += 1
            continue
        if loaded.max_positions is not None and len(ids) > loaded.max_positions:
            too_long += 1
            continue
        # An arc whose two words share a token cannot be told from that token's self-attention.
        kept = [arc for arc in arcs if not share_a_token(from_word, arc[0], arc[1])]
        merged += len(arcs) - len(kept)
        arcs = kept
        if not arcs:
            continue
        sequences.append(ids)
        specials.append(special)
        metas.append({"to_word": to_word, "from_word": from_word, "arcs": arcs, "id": sentence.id})
    notes = []
    if treebank.skipped:
        notes.append(f"{treebank.name}: skipped {len(treebank.skipped)} malformed sentences (--skip-bad)")
    if too_long:
        notes.append(f"{treebank.name}: skipped {too_long} sentences longer than the model's context")
    if unaligned:
        notes.append(f"{treebank.name}: skipped {unaligned} sentences whose words no token covers")
    if merged:
        notes.append(
            f"{treebank.name}: skipped {merged} arcs whose dependent and head share a token "
            "(one token covers both words, so its self-attention cannot be told from attention between them)"
        )
    if not sequences:
        raise InputError(f"{treebank.path}: no sentence has arcs of the chosen relations that can be scored")
    batches = _batches(loaded, sequences, specials, batch_size, metas)
    detector = SyntaxDetector(wanted)
    data_name = f"syntax-{treebank.name}"
    results = score_batches(loaded, batches, [detector], len(sequences), data_name, progress=progress)
    unscored = detector.unscored()
    if unscored:
        notes.append(
            f"{data_name}: not scored, because the target word always comes later and a causal model "
            f"cannot see it: {', '.join(f'{r} {d}' for r, d in unscored)}"
        )
    description = f"{display_path(treebank.path)} ({len(sequences)} sentences)"
    return _prompt_set_report(loaded, results, data_name, description, notes, batches, n_resamples, seed)


# --- coreference --------------------------------------------------------------------------------


def _nearest(pronoun: tuple[int, int], candidates: Sequence[tuple[int, int]], visible: Sequence[bool]) -> int:
    """The visible candidate closest to the pronoun in characters (gap between the spans)."""

    def gap(span: tuple[int, int]) -> int:
        return pronoun[0] - span[1] if span[1] <= pronoun[0] else span[0] - pronoun[1]

    options = [i for i, ok in enumerate(visible) if ok]
    return min(options, key=lambda i: (gap(candidates[i]), -candidates[i][0]))


def coref(
    loaded: LoadedModel,
    data: str | Path | CorefSet,
    *,
    skip_bad: bool = False,
    batch_size: int = 8,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: ProgressFactory | None = None,
) -> Report:
    """Score every head on pronoun → antecedent selection."""
    check_resamples(n_resamples)
    coref_set = data if isinstance(data, CorefSet) else load_coref(data, skip_bad=skip_bad)
    sequences, specials, metas = [], [], []
    cataphora = too_few = merged = 0
    for item in coref_set.items:
        try:
            ids, special, to_word, from_word = encode_with_spans(
                loaded.tokenizer, item.text, [item.pronoun, *item.candidates]
            )
        except AlignmentError as exc:
            raise InputError(f"{item.source}: {exc}") from exc
        # Decided on tokens, not characters: a candidate is visible to a causal model when all its
        # tokens come before the pronoun's; a candidate that shares a token with the pronoun would
        # receive the pronoun's own self-attention, so such an example is left out.
        candidates = range(1, len(item.candidates) + 1)
        if any(share_a_token(from_word, 0, c) for c in candidates):
            merged += 1
            continue
        visible = [precedes(from_word, c, 0) or not loaded.is_causal for c in candidates]
        if not visible[item.antecedent]:
            cataphora += 1
            continue
        if sum(visible) < 2:
            too_few += 1
            continue
        check_context(loaded, len(ids), f"{item.source}: item '{item.id}'")
        sequences.append(ids)
        specials.append(special)
        metas.append(
            {
                "to_word": to_word,
                "from_word": from_word,
                "visible": visible,
                "antecedent": item.antecedent,
                "nearest": _nearest(item.pronoun, item.candidates, visible),
            }
        )
    data_name = coref_set.name
    notes = []
    if coref_set.skipped:
        notes.append(f"{data_name}: skipped {len(coref_set.skipped)} malformed examples (--skip-bad)")
    if cataphora:
        notes.append(
            f"{data_name}: excluded {cataphora} examples whose antecedent follows the pronoun (not visible to a causal model)"
        )
    if too_few:
        notes.append(f"{data_name}: excluded {too_few} examples with fewer than two visible candidates")
    if merged:
        notes.append(
            f"{data_name}: excluded {merged} examples in which a candidate shares a token with the pronoun "
            "(it would receive the pronoun's self-attention)"
        )
    if not sequences:
        raise InputError(f"{coref_set.path}: no example can be scored by this model")
    batches = _batches(loaded, sequences, specials, batch_size, metas)
    results = score_batches(loaded, batches, [CorefDetector()], len(sequences), data_name, progress=progress)
    description = f"{display_path(coref_set.path)} ({len(sequences)} examples)"
    return _prompt_set_report(loaded, results, data_name, description, notes, batches, n_resamples, seed)


class CopyLossMeter:
    """Accumulates next-token loss by copy index from each batch's [B, T-1] token losses.

    Also keeps, per example, the loss summed over the later copies and its token count, so that
    the later-copy loss can be bootstrapped over sequences.
    """

    def __init__(self, offset: int, seq_len: int, repeats: int, n_examples: int) -> None:
        self.offset, self.seq_len, self.repeats = offset, seq_len, repeats
        self.loss_sum = torch.zeros(repeats, dtype=torch.float64)
        self.tokens = torch.zeros(repeats, dtype=torch.long)
        self.later_sum = torch.zeros(n_examples, dtype=torch.float64)
        self.later_tokens = torch.zeros(n_examples, dtype=torch.float64)

    def __call__(self, token_losses: torch.Tensor, batch: capture.Batch) -> None:
        losses = token_losses.cpu()  # [B, T-1]: loss of predicting token t+1
        positions = torch.arange(1, batch.input_ids.shape[1])
        copy_index = (positions - self.offset).div(self.seq_len, rounding_mode="floor")
        in_body = (positions >= self.offset) & (copy_index < self.repeats)
        for copy in range(self.repeats):
            mask = in_body & (copy_index == copy)
            self.loss_sum[copy] += losses[:, mask].double().sum()
            self.tokens[copy] += int(mask.sum()) * losses.shape[0]
        later = in_body & (copy_index >= 1)
        rows = batch.example_index
        self.later_sum[rows] += losses[:, later].double().sum(1)
        self.later_tokens[rows] += float(later.sum())

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
    check_resamples(n_resamples)
    sequences, specials, offset = repeated_tokens(loaded, spec)
    batches = _batches(loaded, sequences, specials, batch_size)
    chosen = detectors.create(["induction", "duplicate-token"])
    meter = None
    notes = []
    if loaded.is_causal and loaded.has_lm_head:
        meter = CopyLossMeter(offset, spec.seq_len, spec.repeats, len(sequences))
    else:
        notes.append("loss by copy not reported: the model is not a causal language model with an LM head")
    results = score_batches(
        loaded, batches, chosen, len(sequences), "repeated-tokens", on_token_loss=meter, progress=progress
    )
    table = assign_roles(
        head_table(results, loaded.layout, loaded.name, n_resamples=n_resamples, seed=spec.seed)
    )
    return Report(
        loaded.name,
        table,
        _sections(results, {"repeated-tokens": _repeat_description(spec)}),
        loaded.capture_mode,
        loss=meter.result() if meter else None,
        notes=notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs={"repeated-tokens": batches},
        repeat=(spec, offset),
    )
