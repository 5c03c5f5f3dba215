"""``coref``: pronoun -> antecedent heads scored on a coreference set."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.data.align import AlignmentError, encode_with_spans, precedes, share_a_token
from headscope.data.defaults import DEFAULT_COREF_SETS
from headscope.data.prompts import CorefSet, builtin, display_path, load_coref
from headscope.detectors.coref import CorefDetector
from headscope.errors import InputError
from headscope.extend.base import (
    ProgressFactory,
    Report,
    check_context,
    model_batches,
    prompt_set_report,
    score_batches,
)
from headscope.extend.checks import TableChecked
from headscope.extend.protocol import (
    HELP_BATCH,
    HELP_SKIP_BAD,
    Outcome,
    Stats,
    check_common,
    option,
    register,
)
from headscope.models import LoadedModel
from headscope.verdicts.stats import check_resamples


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
    batches = model_batches(loaded, sequences, specials, batch_size, metas)
    results = score_batches(loaded, batches, [CorefDetector()], len(sequences), data_name, progress=progress)
    description = f"{display_path(coref_set.path)} ({len(sequences)} examples)"
    return prompt_set_report(loaded, results, data_name, description, notes, batches, n_resamples, seed)


# --- the analysis: options, check, run, verify (the table's ablation), JSON -------------------------


@dataclass(kw_only=True)
class CorefOptions(Stats):
    data: str | Path | None = option(
        None, "Coreference set, YAML or JSONL (default: the shipped English set).", cli_type=Path | None
    )
    skip_bad: bool = option(False, HELP_SKIP_BAD)
    batch_size: int = option(8, HELP_BATCH, min=1)


@register
class Coref(TableChecked):
    name = "coref"
    summary = "Coreference heads: does the pronoun attend most to its antecedent?"
    options = CorefOptions
    sweepable = True

    def check(self, options: CorefOptions) -> CorefSet:
        check_common(options)
        data = options.data if options.data is not None else builtin(DEFAULT_COREF_SETS[0])
        return load_coref(data, skip_bad=options.skip_bad)

    def run(self, loaded: Any, options: CorefOptions, prepared: CorefSet, progress: Any) -> Outcome:
        report = coref(
            loaded,
            prepared,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(report)
