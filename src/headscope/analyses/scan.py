"""``scan``: every detector on the data it is defined on, and the head-role map."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from headscope import capture
from headscope.data.prompts import PromptSet, builtin, display_path, load_texts
from headscope.detectors.base import DetectorResult
from headscope.errors import InputError, Unsupported
from headscope.models import LoadedModel
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import RoleRule, assign_roles
from headscope.verdicts.stats import check_resamples

from .base import (
    ProgressFactory,
    RepeatSpec,
    Report,
    _detectors_for,
    _repeat_description,
    _sections,
    encode_texts,
    model_batches,
    repeated_tokens,
    score_batches,
)
from .coref import coref
from .syntax import syntax

DEFAULT_TEXT_SET = "text/natural.yaml"


DEFAULT_TREEBANKS = ("syntax/en.conllu", "syntax/zh.conllu")


DEFAULT_COREF_SETS = ("coref/en.yaml", "coref/zh.yaml")


DEFAULT_IOI_SETS = ("ioi/en.yaml", "ioi/zh.yaml")


# (needles, haystack) per language. The scan bounds the cost of long prompts: one short context,
# a few needles, two depths; `headscope retrieval` runs the full sweep.
DEFAULT_RETRIEVAL_SETS = (
    ("retrieval/en.yaml", "retrieval/haystack-en.txt"),
    ("retrieval/zh.yaml", "retrieval/haystack-zh.txt"),
)
SCAN_RETRIEVAL = {"context": 1000, "needles": 6, "depths": (0.25, 0.75)}


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
    include_weights: bool | None = None,
) -> Report:
    """Run every detector on the data it is defined on, and (``include_weights``) the weight-only roles.

    ``include_weights`` None means: with every detector (``detector_names`` None), not with a chosen few.

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
        batches = model_batches(loaded, sequences, specials, batch_size)
        descriptions[prompt_set.name] = f"{display_path(prompt_set.path)} ({len(sequences)} texts)"
        inputs[prompt_set.name] = batches
        results += score_batches(
            loaded, batches, text_detectors, len(sequences), prompt_set.name, progress=progress
        )

    token_detectors = _detectors_for("repeated-tokens", detector_names)
    if token_detectors:
        sequences, specials, offset = repeated_tokens(loaded, repeat)
        batches = model_batches(loaded, sequences, specials, batch_size)
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
            # The part ran without intervals on purpose (the scan bootstraps once, below).
            notes += [n for n in part.notes if n not in uncertainty_notes(part.results, 0)]
            inputs.update(part.inputs)

    outcomes: dict = {}
    circuits = [s for s in ("ioi", "retrieval") if _detectors_for(s, detector_names)]
    if circuits and not (loaded.is_causal and loaded.has_lm_head):
        notes.append(
            f"{', '.join(circuits)}: not run: they read next-token predictions of a causal language model"
        )
        circuits = []
    for source in circuits:
        for part in _circuit_parts(loaded, source, batch_size, n_resamples, seed, role_rule, progress, notes):
            results += part.results
            descriptions.update({s.data: s.description for s in part.sections})
            notes += [n for n in part.notes if n not in uncertainty_notes(part.results, n_resamples)]
            inputs.update(part.inputs)
            outcomes.update(part.outcomes)

    if include_weights is None:
        include_weights = detector_names is None
    if include_weights:
        if loaded.has_lm_head:
            from .weights import weights

            try:
                part = weights(loaded, n_resamples=0, seed=seed, progress=progress)
            except Unsupported as exc:
                notes.append(f"weights: not run: {exc}")
            else:
                results += part.results
                descriptions.update({s.data: s.description for s in part.sections})
                notes += [n for n in part.notes if n not in uncertainty_notes(part.results, 0)]
                outcomes.update(part.outcomes)
        else:
            notes.append("weights: not run: the OV token tests read logits, and this model has no LM head")

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
        layout=loaded.layout,
        outcomes=outcomes,
    )


def _circuit_parts(
    loaded: LoadedModel,
    source: str,
    batch_size: int,
    n_resamples: int,
    seed: int,
    role_rule: RoleRule | None,
    progress: ProgressFactory | None,
    notes: list[str],
) -> list[Report]:
    """The IOI sets, or the short retrieval sweep, as reports to merge into the scan."""
    from headscope.data.circuits import load_haystack, load_ioi, load_retrieval

    from .ioi import ioi
    from .retrieval import retrieval

    parts = []
    if source == "ioi":
        for name in DEFAULT_IOI_SETS:
            try:
                report, _, _ = ioi(
                    loaded,
                    load_ioi(builtin(name)),
                    batch_size=batch_size,
                    n_resamples=n_resamples,
                    seed=seed,
                    role_rule=role_rule,
                    progress=progress,
                )
            except (InputError, Unsupported) as exc:
                notes.append(f"{name}: not scored: {exc}")
                continue
            parts.append(report)
        return parts
    for needles_name, haystack_name in DEFAULT_RETRIEVAL_SETS:
        needles = load_retrieval(builtin(needles_name))
        needles.items = needles.items[: SCAN_RETRIEVAL["needles"]]
        try:
            report, _, _, _ = retrieval(
                loaded,
                needles,
                load_haystack(builtin(haystack_name)),
                contexts=(SCAN_RETRIEVAL["context"],),
                depths=SCAN_RETRIEVAL["depths"],
                batch_size=max(1, min(batch_size, 2)),
                n_resamples=n_resamples,
                seed=seed,
                role_rule=role_rule,
                progress=progress,
            )
        except InputError as exc:
            notes.append(f"{needles_name}: not scored: {exc}")
            continue
        parts.append(report)
    return parts
