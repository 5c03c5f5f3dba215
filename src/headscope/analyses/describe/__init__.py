"""``headscope describe``: every head's attention as a short mixture of named templates, fitted on
one split of the texts and measured on another.

This package holds the whole analysis: the template library (:mod:`.templates`), the texts and
their split (:mod:`.texts`), the streamed statistics, fit and measure (:mod:`.fit`), the atlas
(:mod:`.atlas`), and its presentation (:mod:`.present`: the terminal table and the HTML card). It
registers through the public declaration a plugin uses and imports nothing a plugin could not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope import capture
from headscope.errors import InputError
from headscope.extend.base import Report, check_context, detectors_for, model_batches, report_sections
from headscope.extend.protocol import (
    Analysis,
    Outcome,
    Output,
    Stats,
    check_common,
    option,
    register,
    split_names,
)
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import assign_roles

from .atlas import Atlas, build_atlas
from .card import ABLATE_HELP, check_ablate, complete_cards, parse_ablate
from .fit import EvalStats, FitStats, TemplateMaps, fit
from .templates import TEMPLATES, Template, Text, chosen_templates
from .texts import LANGS, balanced, shipped_sources, user_text_sources, user_treebank_sources, windows

__all__ = ["TEMPLATES", "Atlas", "Describe", "DescribeOptions", "Template", "Text"]


@dataclass(kw_only=True)
class DescribeOptions(Stats):
    context: int = option(384, "Tokens per text window (BOS first; CLS ... SEP for encoders).", min=16)
    lang: str = option(
        "en,zh",
        "Languages of the shipped texts to fit on and evaluate on (comma list: en, zh).",
        check=lambda value: _check_langs(value),
    )
    eval_text: Path | None = option(
        None,
        "Evaluate on this UTF-8 text file instead of the shipped evaluation split: paragraphs separated "
        "by blank lines, each cut into --context windows (as icl --text).",
    )
    eval_treebank: Path | None = option(
        None, "Evaluate on this CoNLL-U treebank (its parses feed the dep-head and dep-child templates)."
    )
    windows: int = option(
        12,
        "At most this many windows per split (fit and evaluation), taken in turn from each source; 0: all.",
        min=0,
    )
    templates: str | None = option(
        None, "Describe with only these templates (comma list); default: the whole library."
    )
    max_templates: int = option(4, "At most this many templates per query class.", min=1, max=4)
    conditioning: bool = option(
        True,
        "Let a head's description depend on the query's class where that fits the fit split better.",
        flag="--conditioning/--no-conditioning",
    )
    batch_size: int = option(4, "Windows per forward pass.", min=1)
    writes: bool = option(
        True,
        "Read what each head writes from its OV circuit (weights only, as headscope weights reads it).",
        flag="--writes/--no-writes",
    )
    ablate: str | int | None = option(None, ABLATE_HELP, check=parse_ablate, cli_type=str | None)


def _check_langs(value: str) -> None:
    names = split_names(value) or []
    unknown = [n for n in names if n not in LANGS]
    if not names or unknown:
        raise InputError(f"--lang {value}: choose from {', '.join(LANGS)} (comma list)")


@dataclass
class DescribeInputs:
    fit_sources: list[Any]
    eval_sources: list[Any]
    eval_from: str
    templates: list[str] | None


def _pass(
    loaded: Any,
    texts: list[Text],
    readers: list[Any],
    detectors: list[Any],
    batch: int,
    progress: Any,
    label: str,
) -> list[Any]:
    """One streamed pass over ``texts``: every chunk of every layer to each reader and detector."""
    sequences = [t.ids for t in texts]
    specials = [t.special for t in texts]
    batches = model_batches(loaded, sequences, specials, batch)
    for detector in detectors:
        detector.start(loaded.layout, len(texts))

    def on_layer(layer: int, attn: Any, found: capture.Batch, q_start: int) -> None:
        for reader in readers:
            reader.update(layer, attn, found, q_start)
        for detector in detectors:
            detector.update(layer, attn, found, q_start)

    def on_layer_done(layer: int, found: capture.Batch) -> None:
        for detector in detectors:
            detector.end_layer(layer, found)

    advance = progress(label, len(texts)) if progress else None
    capture.run(
        loaded,
        batches,
        on_layer,
        on_layer_done=on_layer_done,
        on_batch_done=(lambda b: advance(len(b.example_index))) if advance else None,
    )
    return batches


def describe_heads(
    loaded: Any,
    fit_sources: list[Any],
    eval_sources: list[Any],
    *,
    eval_from: str,
    context: int,
    windows_per_split: int | None,
    templates: list[str] | None = None,
    max_templates: int = 4,
    conditioning: bool = True,
    batch_size: int = 4,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: Any = None,
    detectors: list[Any] | None = None,
) -> tuple[Atlas, list[Any]]:
    """Fit every head's description on ``fit_sources`` and measure it on ``eval_sources``: the atlas
    (roles left empty: :meth:`Atlas.set_roles`), and the evaluation batches. ``detectors`` ride
    along on the evaluation pass (describe's own roles; scan brings its own)."""
    fit_texts = balanced(windows(loaded, fit_sources, context), windows_per_split)
    eval_texts = balanced(windows(loaded, eval_sources, context), windows_per_split)
    if len(eval_texts) < 2:
        raise InputError(
            f"{eval_from}: {len(eval_texts)} window of text to evaluate on; the intervals need at least 2",
            hint="give a longer text, or a smaller --context",
        )
    if len(fit_texts) < 1:
        raise InputError("no text to fit the descriptions on", hint="check --lang")
    chosen = chosen_templates(loaded.is_causal, templates)
    n_layers, n_heads = loaded.layout.n_layers, loaded.layout.n_heads
    stats = FitStats(TemplateMaps(chosen, fit_texts), fit_texts, n_layers, n_heads)
    _pass(loaded, fit_texts, [stats], [], batch_size, progress, "describe: fit")
    fitted = fit(stats, max_templates=max_templates, conditioning=conditioning)
    measured = EvalStats(TemplateMaps(chosen, eval_texts), eval_texts, fitted, n_layers, n_heads)
    batches = _pass(
        loaded, eval_texts, [measured], detectors or [], batch_size, progress, "describe: evaluate"
    )
    found = build_atlas(
        loaded,
        chosen,
        fitted,
        measured,
        fit_texts=fit_texts,
        eval_texts=eval_texts,
        eval_from=eval_from,
        n_resamples=n_resamples,
        seed=seed,
    )
    return found, batches


@register
class Describe(Analysis):
    name = "describe"
    summary = (
        "Every head's attention as a short mixture of named patterns (templates), fitted on one split of "
        "the texts and measured on another: what each head looks at, and how much that explains."
    )
    options = DescribeOptions
    print_sections = False
    json_roles = True
    sweepable = True
    outputs = (
        Output(
            "--html",
            "Write a self-contained HTML page of every head's card.",
            lambda r, p, f: describe_html(r, p, f),
            first=True,
        ),
    )

    def check(self, options: DescribeOptions) -> DescribeInputs:
        check_common(options)
        names = split_names(options.templates)
        if names is not None:
            chosen_templates(True, names)  # unknown names are refused here
            if not names:
                raise InputError(
                    "--templates is empty", hint="name at least one template, or drop --templates"
                )
        langs = split_names(options.lang) or list(LANGS)
        fit_sources = shipped_sources("fit", langs)
        if options.eval_text is not None and options.eval_treebank is not None:
            raise InputError("give --eval-text or --eval-treebank, not both")
        if options.eval_text is not None:
            eval_sources, eval_from = user_text_sources(options.eval_text), str(options.eval_text)
        elif options.eval_treebank is not None:
            eval_sources, eval_from = user_treebank_sources(options.eval_treebank), str(options.eval_treebank)
        else:
            eval_sources, eval_from = shipped_sources("eval", langs), "the shipped evaluation split"
        return DescribeInputs(fit_sources, eval_sources, eval_from, names)

    def check_loaded(self, loaded: Any, options: DescribeOptions) -> None:
        extra = 1 if loaded.is_causal else 2
        check_context(loaded, options.context + extra, f"--context {options.context} (with special tokens)")
        check_ablate(loaded, options.ablate)

    def run(self, loaded: Any, options: DescribeOptions, prepared: DescribeInputs, progress: Any) -> Outcome:
        detectors = detectors_for("text", None)
        found, batches = describe_heads(
            loaded,
            prepared.fit_sources,
            prepared.eval_sources,
            eval_from=prepared.eval_from,
            context=options.context,
            windows_per_split=options.windows or None,
            templates=prepared.templates,
            max_templates=options.max_templates,
            conditioning=options.conditioning,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
            detectors=detectors,
        )
        layout = loaded.layout
        results = [r for d in detectors for r in d.results("describe-eval")]
        table = assign_roles(
            head_table(results, layout, loaded.name, n_resamples=options.resamples, seed=options.seed)
        )
        found.set_roles(table)
        complete_cards(found, loaded, batches, options, progress)
        eval_texts = found.evaluation["windows"]
        notes = uncertainty_notes(results, options.resamples) + found.notes
        report = Report(
            loaded.name,
            table,
            report_sections(results, {"describe-eval": f"{prepared.eval_from} ({eval_texts} windows)"}),
            loaded.capture_mode,
            notes=notes,
            results=results,
            inputs={"describe-eval": batches},
            layout=layout,
        )
        report.measures.update(found.measures())
        return Outcome(report, state={"atlas": found})

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"atlas": outcome.state["atlas"].to_json()}

    def present(self, result: Any, console: Any, top: int) -> None:
        from .present import print_atlas

        print_atlas(result.atlas, console, top)

    def html_section(self, result: Any) -> str | None:
        from .present import STYLE, atlas_html

        atlas = result.atlas  # live, or read back from a saved result
        return None if atlas is None else f"<style>{STYLE}</style>" + atlas_html(atlas)


def describe_html(result: Any, path: Path, force: bool) -> str:
    """``--html``: every head's card as one self-contained page."""
    from .present import write_html

    return write_html(result, path, force)
