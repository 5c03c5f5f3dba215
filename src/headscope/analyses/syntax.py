"""``syntax``: syntactic heads scored on a CoNLL-U treebank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.data.align import AlignmentError, encode_with_spans, share_a_token
from headscope.data.conllu import Treebank, read_conllu
from headscope.data.defaults import DEFAULT_TREEBANKS
from headscope.data.prompts import builtin, display_path
from headscope.detectors.syntax import DEFAULT_RELATIONS, SyntaxDetector
from headscope.errors import InputError
from headscope.extend.base import ProgressFactory, Report, model_batches, prompt_set_report, score_batches
from headscope.extend.checks import TableChecked
from headscope.extend.protocol import (
    HELP_BATCH,
    HELP_SKIP_BAD,
    Outcome,
    Stats,
    check_common,
    option,
    register,
    split_names,
)
from headscope.models import LoadedModel
from headscope.verdicts.stats import check_resamples


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
    batches = model_batches(loaded, sequences, specials, batch_size, metas)
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
    return prompt_set_report(loaded, results, data_name, description, notes, batches, n_resamples, seed)


# --- the analysis: options, check, run, verify (the tables' ablation), JSON -------------------------


@dataclass(kw_only=True)
class SyntaxOptions(Stats):
    treebank: str | Path | None = option(
        None, "A CoNLL-U file (default: the shipped English set).", cli_type=Path | None
    )
    relations: str | list[str] | None = option(
        None, "Comma-separated UD relations (default: nsubj,obj,det,…).", cli_type=str | None
    )
    limit: int | None = option(None, "Read at most N sentences.", min=1)
    skip_bad: bool = option(False, HELP_SKIP_BAD)
    batch_size: int = option(8, HELP_BATCH, min=1)


@dataclass(frozen=True)
class SyntaxInputs:
    """What ``Syntax.check`` reads and checks before the model loads."""

    treebank: Treebank
    relations: list[str] | None  # None: the default relations that occur


@register
class Syntax(TableChecked):
    name = "syntax"
    summary = (
        "Syntactic heads: per relation and direction, the best head against the best positional baseline."
    )
    options = SyntaxOptions
    sweepable = True
    takes_top = False

    def check(self, options: SyntaxOptions) -> SyntaxInputs:
        check_common(options)
        source = options.treebank if options.treebank is not None else builtin(DEFAULT_TREEBANKS[0])
        parsed = read_conllu(source, skip_bad=options.skip_bad, limit=options.limit)
        wanted = split_names(options.relations) or None
        check_relations(parsed, wanted)
        return SyntaxInputs(treebank=parsed, relations=wanted)

    def run(self, loaded: Any, options: SyntaxOptions, prepared: SyntaxInputs, progress: Any) -> Outcome:
        report = syntax(
            loaded,
            prepared.treebank,
            relations=prepared.relations,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(report)
