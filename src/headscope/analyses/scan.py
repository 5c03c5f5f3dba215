"""``scan``: every detector on the data it is defined on, and the head-role map."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headscope import capture, detectors
from headscope.data.defaults import DEFAULT_COREF_SETS, DEFAULT_TEXT_SET, DEFAULT_TREEBANKS
from headscope.data.prompts import PromptSet, builtin, display_path, load_texts
from headscope.detectors.base import DetectorResult
from headscope.errors import InputError, Unsupported
from headscope.extend.base import (
    ProgressFactory,
    RepeatSpec,
    Report,
    detectors_for,
    encode_texts,
    model_batches,
    repeat_description,
    repeated_tokens,
    report_sections,
    score_batches,
)
from headscope.extend.checks import Check, check_repeat_context, too_many
from headscope.extend.protocol import (
    HELP_BATCH,
    Analysis,
    Outcome,
    Output,
    Repeat,
    Stats,
    check_common,
    option,
    register,
    spelled,
    split_names,
)
from headscope.extend.writers import html_report, roles_csv
from headscope.models import LoadedModel
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import RoleRule, assign_roles
from headscope.verdicts.stats import check_resamples

# The scan draws on every other analysis, and imports each where it uses it: importing this module
# registers Scan alone, so the registry's order is the order analyses/__init__.py imports them in.

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
    own_sets: dict[str, PromptSet] | None = None,
) -> Report:
    """Run every detector on the data it is defined on, and (``include_weights``) the weight-only roles.

    ``include_weights`` None means: with every detector (``detector_names`` None), not with a chosen few.

    Position detectors (previous-token, sink) read natural text; token-identity detectors
    (duplicate-token, induction) read repeated random tokens, where the right answer is known;
    syntax and coreference read the shipped annotated English and Chinese sets.
    """
    from .coref import coref
    from .syntax import syntax

    if batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, got {batch_size}")
    check_resamples(n_resamples)
    repeat = repeat or RepeatSpec(seed=seed)
    if not isinstance(text_set, PromptSet):
        text_set = load_texts(text_set if text_set is not None else builtin(DEFAULT_TEXT_SET))
    parts = _Parts(loaded, n_resamples, seed, progress)

    text_detectors = detectors_for("text", detector_names)
    if text_detectors:
        with parts.part("text") as part:
            _score_prompt_set(part, loaded, text_set, text_detectors, batch_size, progress)

    # Declared detectors that bring their own prompt set (a plugin's brackets, say): one part per set,
    # read by Scan.check before the model loaded (``own_sets``) or here.
    own_sets = own_sets or {}
    for path, own in _own_sources(detector_names).items():
        own_set = own_sets.get(path) or load_texts(path)
        with parts.part(own_set.name) as part:
            _score_prompt_set(part, loaded, own_set, own, batch_size, progress)

    token_detectors = detectors_for("repeated-tokens", detector_names)
    if token_detectors:
        with parts.part("repeated-tokens") as part:
            sequences, specials, offset = repeated_tokens(loaded, repeat)
            batches = model_batches(loaded, sequences, specials, batch_size)
            part.descriptions["repeated-tokens"] = repeat_description(repeat)
            part.inputs["repeated-tokens"] = batches
            parts.repeat = (repeat, offset)
            part.results += score_batches(
                loaded, batches, token_detectors, len(sequences), "repeated-tokens", progress=progress
            )

    for source, names, score_set in (
        ("treebank", DEFAULT_TREEBANKS, syntax),
        ("coref", DEFAULT_COREF_SETS, coref),
    ):
        if not detectors_for(source, detector_names):
            continue
        for name in names:
            with parts.part(name) as part:
                try:
                    found = score_set(
                        loaded, builtin(name), batch_size=batch_size, n_resamples=0, progress=progress
                    )
                except InputError as exc:
                    # A shipped set this model's tokenizer cannot align (every arc inside one token,
                    # say) is reported and left out; it does not stop the rest of the scan.
                    parts.notes.append(f"{name}: not scored: {exc}")
                    continue
                # The part ran without intervals on purpose (the scan bootstraps once, per part).
                part.merge(found, without=uncertainty_notes(found.results, 0))

    circuits = [s for s in ("ioi", "retrieval") if detectors_for(s, detector_names)]
    if circuits and not (loaded.is_causal and loaded.has_lm_head):
        parts.notes.append(
            f"{', '.join(circuits)}: not run: they read next-token predictions of a causal language model"
        )
        circuits = []
    for source in circuits:
        _circuit_parts(loaded, source, batch_size, n_resamples, seed, role_rule, progress, parts)

    if include_weights is None:
        include_weights = detector_names is None
    if include_weights:
        from .weights import weights

        if loaded.has_lm_head:
            with parts.part("weights") as part:
                try:
                    found = weights(loaded, n_resamples=0, seed=seed, progress=progress)
                except Unsupported as exc:
                    parts.notes.append(f"weights: not run: {exc}")
                else:
                    part.merge(found, without=uncertainty_notes(found.results, 0))
        else:
            parts.notes.append(
                "weights: not run: the OV token tests read logits, and this model has no LM head"
            )

    started = time.perf_counter()
    frames = [p.table for p in parts.done if len(p.table)]
    table = pd.concat(frames, ignore_index=True) if frames else head_table([], loaded.layout, loaded.name)
    table = assign_roles(table, role_rule)
    parts.timings["roles"] = time.perf_counter() - started
    results = [r for p in parts.done for r in p.results]
    descriptions = {k: v for p in parts.done for k, v in p.descriptions.items()}
    return Report(
        loaded.name,
        table,
        report_sections(results, descriptions),
        loaded.capture_mode,
        notes=parts.notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs={k: v for p in parts.done for k, v in p.inputs.items()},
        repeat=parts.repeat,
        layout=loaded.layout,
        outcomes={k: v for p in parts.done for k, v in p.outcomes.items()},
        timings=parts.timings,
    )


def _score_prompt_set(
    part: _Part,
    loaded: LoadedModel,
    prompt_set: PromptSet,
    chosen: Sequence[Any],
    batch_size: int,
    progress: ProgressFactory | None,
) -> None:
    """One prompt set through ``chosen`` detectors, as a part of the scan (its inputs kept for --verify)."""
    sequences, specials = encode_texts(loaded, prompt_set)
    batches = model_batches(loaded, sequences, specials, batch_size)
    part.descriptions[prompt_set.name] = f"{display_path(prompt_set.path)} ({len(sequences)} texts)"
    part.inputs[prompt_set.name] = batches
    part.results += score_batches(loaded, batches, chosen, len(sequences), prompt_set.name, progress=progress)


def _own_sources(names: Sequence[str] | None) -> dict[str, list[Any]]:
    """Detectors whose source is a prompt-set file, grouped by that file (in registry order)."""

    grouped: dict[str, list[Any]] = {}
    for detector in detectors.create(list(names) if names is not None else None):
        if detector.default_source not in BUILT_IN_SOURCES:
            grouped.setdefault(detector.default_source, []).append(detector)
    return grouped


# The sources the scan reads itself: its text set, repeated random tokens, and its shipped sets.
BUILT_IN_SOURCES = ("text", "repeated-tokens", "treebank", "coref", "ioi", "retrieval")


@dataclass
class _Part:
    """One step of the scan (a data set through its detectors): what it found, and its table."""

    name: str
    results: list[DetectorResult] = field(default_factory=list)
    descriptions: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, list[capture.Batch]] = field(default_factory=dict)
    outcomes: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None

    def merge(self, report: Report, without: Sequence[str] = ()) -> None:
        self.results += report.results
        self.descriptions.update({s.data: s.description for s in report.sections})
        self.notes += [n for n in report.notes if n not in without]
        self.inputs.update(report.inputs)
        self.outcomes.update(report.outcomes)


class _Parts:
    """The scan's steps in order, each timed, tabled once (intervals per table do not depend on the
    other tables), and handed to the progress reporter's ``on_part`` (the CLI prints it at once)."""

    def __init__(self, loaded: LoadedModel, n_resamples: int, seed: int, progress: Any) -> None:
        self.loaded, self.n_resamples, self.seed = loaded, n_resamples, seed
        self.on_part = getattr(progress, "on_part", None)
        self.done: list[_Part] = []
        self.notes: list[str] = []
        self.timings: dict[str, float] = {}
        self.repeat: tuple[RepeatSpec, int] | None = None

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[_Part]:
        started = time.perf_counter()
        part = _Part(name)
        with capture.ledger.part(name):
            yield part
        part.table = head_table(
            part.results, self.loaded.layout, self.loaded.name, n_resamples=self.n_resamples, seed=self.seed
        )
        self.notes += part.notes
        self.done.append(part)
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started
        if self.on_part is not None and part.results:
            self.on_part(
                Report(
                    self.loaded.name,
                    part.table,
                    report_sections(part.results, part.descriptions),
                    self.loaded.capture_mode,
                    results=part.results,
                    layout=self.loaded.layout,
                    outcomes=part.outcomes,
                )
            )


def _circuit_parts(
    loaded: LoadedModel,
    source: str,
    batch_size: int,
    n_resamples: int,
    seed: int,
    role_rule: RoleRule | None,
    progress: ProgressFactory | None,
    parts: _Parts,
) -> None:
    """The IOI sets, or the short retrieval sweep, each as a part of the scan."""
    from headscope.data.circuits import load_haystack, load_ioi, load_retrieval

    from .ioi import ioi
    from .retrieval import retrieval

    if source == "ioi":
        for name in DEFAULT_IOI_SETS:
            with parts.part(name) as part:
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
                    parts.notes.append(f"{name}: not scored: {exc}")
                    continue
                part.merge(report, without=uncertainty_notes(report.results, n_resamples))
        return
    for needles_name, haystack_name in DEFAULT_RETRIEVAL_SETS:
        with parts.part(needles_name) as part:
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
                parts.notes.append(f"{needles_name}: not scored: {exc}")
                continue
            part.merge(report, without=uncertainty_notes(report.results, n_resamples))


# --- the analysis: options, check, run, verify, JSON ------------------------------------------------


@dataclass(kw_only=True)
class ScanOptions(Repeat, Stats):
    text: str | Path | None = option(
        None,
        "Natural-text prompt set (.yaml/.jsonl/.txt) for previous-token and sink.",
        cli_type=Path | None,
    )
    detectors: str | list[str] | None = option(
        None,
        "Comma-separated detectors, 'weights' for the weight-only roles (default: all).",
        cli_type=str | None,
    )
    batch_size: int = option(8, HELP_BATCH, min=1)
    verify: bool = option(
        False, "Ablate each table's top heads and a random control; report the loss effect."
    )
    verify_k: int = option(3, "Heads ablated per table by --verify.", min=1)
    weights: bool | None = option(
        None,
        "Also score the weight-only roles (copy, supp, succ). Default: with every detector, or when "
        "--detectors lists 'weights'.",
        flag="--weights/--no-weights",
    )
    role_threshold: float = option(0.3, "Minimum score for a role.")
    role_margin: float = option(0.05, "ci_low must clear the baseline by this much.")
    alpha: float = option(0.05, "False discovery rate for roles (Benjamini–Hochberg).", min=0.0, max=1.0)
    describe: int = option(
        4,
        "Describe the heads without a working role by their dominant template (as headscope describe, on "
        "this many windows of 256 tokens per split of the shipped texts); 0: no descriptions.",
        min=0,
    )


@dataclass(frozen=True)
class ScanInputs:
    """What ``Scan.check`` reads and checks before the model loads."""

    names: list[str] | None  # attention detectors (None: all)
    weights: bool  # also the weight-only roles
    text_set: PromptSet
    rule: RoleRule
    own_sets: dict[str, PromptSet] = field(default_factory=dict)  # declared detectors' own prompt sets
    # The shipped texts the role map's descriptions are fitted on and measured on (None: --describe 0).
    describe_sources: tuple[list[Any], list[Any]] | None = None


@register
class Scan(Analysis):
    name = "scan"
    summary = "Score every head with every detector, print the top heads of each and the role map."
    options = ScanOptions
    sweepable = True
    json_roles = True
    spaced_checks = True
    outputs = (
        Output("--roles-csv", "Write one row per head: its role and the score behind it.", roles_csv),
        Output("--html", "Write a self-contained HTML report (role map, head panels, tables).", html_report),
    )

    def check(self, options: ScanOptions) -> ScanInputs:
        check_common(options)
        names = split_names(options.detectors)
        if names is not None and not names:
            if isinstance(options.detectors, str) and not options.detectors.strip():
                names = None  # --detectors "" means all, as it always did
            else:
                raise InputError("--detectors names no detector", hint="leave it out for all of them")
        include_weights = options.weights is not False
        if names is not None:
            # "weights" names the weight-only roles; the rest are attention detectors.
            listed = "weights" in names
            if options.weights is True and not listed:
                raise InputError(
                    f"{spelled('weights', True)} asks for the weight-only roles, but "
                    f"{spelled('detectors', options.detectors)} leaves them out",
                    hint="add 'weights' to the detectors, or leave the weights option out",
                )
            include_weights = listed and options.weights is not False
            names = [n for n in names if n != "weights"]
            detectors.create(names)  # reject unknown names before loading anything
        # A declared detector's own prompt set: read and checked before the model, read once.
        own_sets = {path: load_texts(path) for path in _own_sources(names)}
        options.repeat_spec(options.seed).validate()
        text = options.text if options.text is not None else builtin(DEFAULT_TEXT_SET)
        return ScanInputs(
            names=names,
            weights=include_weights,
            text_set=load_texts(text),
            own_sets=own_sets,
            rule=RoleRule(threshold=options.role_threshold, margin=options.role_margin, alpha=options.alpha),
            describe_sources=_describe_sources() if options.describe else None,
        )

    def check_loaded(self, loaded: Any, options: ScanOptions) -> None:
        check_repeat_context(loaded, options)
        if options.verify:
            too_many(loaded, options.verify_k, "verify_k", "a random control of the same size")

    def run(self, loaded: Any, options: ScanOptions, prepared: ScanInputs, progress: Any) -> Outcome:
        report = scan(
            loaded,
            text_set=prepared.text_set,
            repeat=options.repeat_spec(options.seed),
            detector_names=prepared.names,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            role_rule=prepared.rule,
            progress=progress,
            include_weights=prepared.weights,
            own_sets=prepared.own_sets,
        )
        state: dict[str, Any] = {"rule": prepared.rule, "verified": False}
        if prepared.describe_sources is not None:
            _describe_without_roles(loaded, report, options, prepared.describe_sources, state, progress)
        return Outcome(report, state=state)

    def wants_verify(self, options: ScanOptions) -> bool:
        return options.verify

    def verify(
        self, loaded: Any, outcome: Outcome, options: ScanOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        """Token-loss ablation of every table, then the circuit tables by their own measures."""
        from headscope.extend.ablation import verify as verify_tables

        too_many(loaded, k or options.verify_k, "k" if k else "verify_k", "a random control of the same size")
        k = k or options.verify_k
        report = outcome.report
        outcome.state.update(verified=True, k=k)
        checks = [
            Check("table", c)
            for c in verify_tables(loaded, report, k=k, seed=options.seed, progress=progress)
        ]
        return checks + _verify_circuits(loaded, report, k, options.seed, progress)

    def html_section(self, result: Any) -> str | None:
        """The describe card of each head scan described (its atlas), for the report's head panel."""
        from .scan_present import head_cards

        atlas = result.state.get("atlas")
        return head_cards(atlas if atlas is not None else result.to_dict().get("atlas"))

    def json(self, outcome: Outcome) -> dict[str, Any]:
        tables = [c.to_json() for c in outcome.checks if c.kind == "table"]
        circuits = [c.to_json() for c in outcome.checks if c.kind != "table"]
        atlas = outcome.state.get("atlas")
        return {
            "role_rule": outcome.state["rule"].describe(),
            "verification": tables if outcome.state.get("verified") else None,
            "circuit_verification": circuits or None,
            "atlas": atlas.to_json() if atlas is not None else None,
        }


def _describe_sources() -> tuple[list[Any], list[Any]]:
    from .describe.texts import shipped_sources

    return shipped_sources("fit"), shipped_sources("eval")


def _describe_without_roles(
    loaded: Any,
    report: Any,
    options: ScanOptions,
    sources: tuple[list[Any], list[Any]],
    state: dict,
    progress: Any,
) -> None:
    """The role map's answer for heads without a working role: each head's description (fitted on the
    fit split, measured on the evaluation split), its dominant template in the map, and sink only
    where the head really puts most of its attention on the first token."""
    from headscope.verdicts.roles import head_roles

    from .describe import describe_heads
    from .describe.atlas import role_map_fill

    started = time.perf_counter()
    limit = loaded.max_positions
    # Half the model's context at most: a tiny model's stated limit can be the position table's size,
    # which some encoders (RoBERTa: positions start after the padding index) cannot fill.
    context = 256 if limit is None else max(16, min(256, limit // 2))
    atlas, _ = describe_heads(
        loaded,
        sources[0],
        sources[1],
        eval_from="the shipped evaluation split",
        context=context,
        windows_per_split=options.describe,
        batch_size=4,
        n_resamples=options.resamples,
        seed=options.seed,
        progress=progress,
        heatmaps=False,  # the report's panel shows the cards without them
    )
    atlas.set_roles(report.table)
    roles = {(int(r.layer), int(r.head)): r.role for r in head_roles(report.table).itertuples()}
    state["atlas"] = atlas
    state["role_map_fill"] = role_map_fill(atlas, roles)
    report.measures.update({f"describe_{k}": v for k, v in atlas.measures().items()})
    report.timings["describe"] = time.perf_counter() - started


def _verify_circuits(loaded: Any, report: Any, k: int, seed: int, progress: Any) -> list[Check]:
    """The circuit tables of a scan: name movers by logit difference, retrieval heads by needle
    accuracy, successor heads by ordinal continuations. Each outcome names its own check."""
    from headscope.verdicts.heads import top_heads

    from .ioi import IOIOutcome, verify_ioi
    from .retrieval import NeedleOutcome, ablate_retrieval
    from .weights import WeightOutcome, verify_successor

    out: list[Check] = []
    for data, outcome in report.outcomes.items():
        if isinstance(outcome, WeightOutcome):
            for name in outcome.resolved:
                check = verify_successor(loaded, report, name, k=k, draws=1, seed=seed)
                if check is not None:
                    out.append(Check("successor", check))
        elif isinstance(outcome, IOIOutcome):
            check = verify_ioi(loaded, report, data, draws=1, seed=seed)
            if check is not None:
                out.append(Check("ioi", check))
        elif isinstance(outcome, NeedleOutcome):
            heads = top_heads(report.table, "retrieval", k, data=data)
            effect = ablate_retrieval(
                loaded,
                outcome.prompts,
                report.inputs[data],
                heads,
                outcome,
                draws=1,
                seed=seed,
                progress=progress,
                data=data,
            )
            out.append(Check("retrieval", effect))
    return out
