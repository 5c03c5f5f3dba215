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

import numpy as np

from headscope.capture import rows as capture_rows
from headscope.errors import InputError
from headscope.extend.base import (
    Report,
    check_context,
    detectors_for,
    model_batches,
    report_sections,
    score_batches,
)
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
from headscope.extend.writers import html_grid
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import assign_roles

from .atlas import Atlas, build_atlas
from .card import ABLATE_HELP, check_ablate, complete_cards, parse_ablate
from .fit import EvalStats, ExcerptRows, FitStats, RowSample, TemplateMaps, fit
from .templates import TEMPLATES, Template, Text, chosen_templates
from .texts import (
    LANGS,
    balanced,
    check_langs,
    shipped_sources,
    user_text_sources,
    user_treebank_sources,
    windows,
)

__all__ = ["TEMPLATES", "Atlas", "Describe", "DescribeOptions", "Template", "Text"]


@dataclass(kw_only=True)
class DescribeOptions(Stats):
    context: int = option(384, "Tokens per text window (BOS first; CLS ... SEP for encoders).", min=16)
    lang: str = option(
        "en,zh",
        "Languages of the shipped texts to fit on and evaluate on (comma list: en, zh).",
        check=check_langs,
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
    rows: int = option(
        64,
        "Query rows read per window (in blocks of 16, a seeded systematic sample): each head's share is "
        "its mean over the queries, estimated from these rows; 0: every row (exact, slower).",
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
    why: bool = option(
        False,
        "Add each head's why block: the sources of its queries and keys (headscope qk) on the same fit "
        "and evaluation windows. Costs a decomposition per layer and window (see headscope qk).",
        flag="--why/--no-why",
    )


@dataclass
class DescribeInputs:
    fit_sources: list[Any]
    eval_sources: list[Any]
    eval_from: str
    templates: list[str] | None


class _Sampled:
    """A reader of a describe pass (its statistics, or a detector riding along) that reads the
    sampled rows only: its ``reads`` is the pass's sample, whatever the detector would declare (a
    detector's pairs would make the capture compute every row)."""

    def __init__(self, inner: Any, sample: RowSample) -> None:
        self.inner, self.sample = inner, sample

    def start(self, layout: Any, n_examples: int) -> None:
        if hasattr(self.inner, "start"):
            self.inner.start(layout, n_examples)

    def reads(self, batch: Any) -> Any:
        return self.sample(batch)

    def update(self, layer: int, attn: Any, batch: Any, q_start: int = 0) -> None:
        # The capture hands every reader the rows any of them reads (describe's evaluation reads its
        # excerpts too): each reader gets the runs of its own rows only.
        mine = self.sample(batch)[:, q_start : q_start + attn.shape[2]].any(0)
        if bool(mine.all()):
            self.inner.update(layer, attn, batch, q_start)
            return
        for start, stop in capture_rows.spans(mine[None]):
            keys = min(attn.shape[3], q_start + stop) if batch.is_causal else attn.shape[3]
            self.inner.update(layer, attn[:, :, start:stop, :keys], batch, q_start + start)

    def end_layer(self, layer: int, batch: Any) -> None:
        if hasattr(self.inner, "end_layer"):
            self.inner.end_layer(layer, batch)

    def results(self, data: str) -> list[Any]:
        return self.inner.results(data) if hasattr(self.inner, "results") else []


def _pass(
    loaded: Any,
    texts: list[Text],
    readers: list[Any],
    sample: RowSample,
    batch: int,
    progress: Any,
    label: str,
    extra: tuple[Any, Any] | None = None,
) -> list[Any]:
    """One streamed pass over ``texts`` (the shared scorer): the sampled rows of every layer to
    each reader (describe's statistics and any detectors). ``extra``: ``(reader, reads)``, one
    reader that reads more rows than the sample (the evaluation's excerpts)."""
    batches = model_batches(loaded, [t.ids for t in texts], [t.special for t in texts], batch)
    wrapped = [_Sampled(r, sample) for r in readers]
    if extra is not None:
        reader, reads = extra
        wrapped = [_Sampled(reader, capture_rows.union([sample, reads])), *wrapped]
    score_batches(loaded, batches, wrapped, len(texts), label, progress=progress)
    return batches


def _check_eval_windows(eval_texts: list[Any], eval_from: str) -> None:
    if len(eval_texts) < 2:
        raise InputError(
            f"{eval_from}: {len(eval_texts)} window of text to evaluate on; the intervals need at least 2",
            hint="give a longer text, or a smaller --context",
        )


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
    rows: int | None = 64,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: Any = None,
    detectors: list[Any] | None = None,
    heatmaps: bool = True,
) -> tuple[Atlas, list[Any]]:
    """Fit every head's description on ``fit_sources`` and measure it on ``eval_sources``: the atlas
    (roles left empty: :meth:`Atlas.set_roles`), and the evaluation batches. ``detectors`` ride
    along on the evaluation pass (describe's own roles; scan brings its own). ``rows``: the query
    rows read per window (:class:`~.fit.RowSample`; None: every row). ``heatmaps``: also read each
    window's excerpt for the cards' two heatmaps (:class:`~.fit.ExcerptRows`; scan does not)."""
    # A source given twice ("--lang en,en") would be read twice and bootstrapped as independent.
    fit_sources = list({s.name: s for s in fit_sources}.values())
    eval_sources = list({s.name: s for s in eval_sources}.values())
    fit_texts = balanced(windows(loaded, fit_sources, context), windows_per_split)
    eval_texts = balanced(windows(loaded, eval_sources, context), windows_per_split)
    _check_eval_windows(eval_texts, eval_from)
    if len(fit_texts) < 1:
        raise InputError("no text to fit the descriptions on", hint="check --lang")
    chosen = chosen_templates(loaded.is_causal, templates)
    fit_maps = TemplateMaps(chosen, fit_texts)
    chosen, silent = _applying(chosen, fit_maps, fit_texts)
    if silent:
        fit_maps = TemplateMaps(chosen, fit_texts)
    n_layers, n_heads = loaded.layout.n_layers, loaded.layout.n_heads
    rows = rows or None
    fit_rows, eval_rows = RowSample(rows, seed, salt=0), RowSample(rows, seed, salt=1)
    stats = FitStats(fit_maps, fit_texts, n_layers, n_heads, fit_rows)
    _pass(loaded, fit_texts, [stats], fit_rows, batch_size, progress, "describe: fit")
    fitted = fit(stats, max_templates=max_templates, conditioning=conditioning)
    excerpts = ExcerptRows(eval_texts) if heatmaps else None
    measured = EvalStats(
        TemplateMaps(chosen, eval_texts), eval_texts, fitted, n_layers, n_heads, eval_rows, excerpts
    )
    batches = _pass(
        loaded,
        eval_texts,
        list(detectors or []) if excerpts else [measured, *(detectors or [])],
        eval_rows,
        batch_size,
        progress,
        "describe: evaluate",
        extra=(measured, excerpts) if excerpts else None,
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
    if silent:
        found.notes.append(
            f"describe: {', '.join(silent)} name{'s' if len(silent) == 1 else ''} no key this model can "
            f"attend to on the {len(fit_texts)} fit windows (none, or only keys after the query); left out"
        )
    # The measure is each head's mean over its queries; these rows per window are its estimator.
    found.evaluation["rows_per_window"] = rows  # None: every row
    found.fit["rows_per_window"] = rows
    return found, batches


def _applying(
    chosen: list[Template], maps: TemplateMaps, texts: list[Text]
) -> tuple[list[Template], list[str]]:
    """The templates that name at least one key at some query of the fit texts, and the names of
    those that name none (an encoder-only pattern on a causal model, a user's template whose keys
    all lie after the query, or one with no targets): a template that never applies would leave
    every head "none", explained 0, with nothing said. None applying is refused."""
    hits = np.zeros(len(chosen), dtype=bool)
    for example in range(len(texts)):
        hits |= maps.named(example)
    silent = [template.name for template, hit in zip(chosen, hits, strict=True) if not hit]
    if len(silent) == len(chosen):
        raise InputError(
            f"no template names a key this model can attend to on the {len(texts)} fit windows "
            f"({', '.join(silent)}): every head would be described by nothing",
            hint="choose templates that look at the query's own or earlier keys (--templates)",
        )
    return [template for template, hit in zip(chosen, hits, strict=True) if hit], silent


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
    draws_beside = True  # headscope report a.json b.json: the second model's atlas beside the first's
    outputs = (
        Output(
            "--html",
            "Write a self-contained HTML page: every head in a grid (colour: dominant kind; lightness: "
            "explained share), filters, summary plots, and each head's card with its heatmaps "
            "(page.html#L18H6 opens one head).",
            html_grid,
            first=True,
        ),
    )

    def check(self, options: DescribeOptions) -> DescribeInputs:
        check_common(options)
        names = split_names(options.templates)
        if names is not None:
            chosen_templates(False, names)  # unknown names are refused here (encoder-only ones once loaded)
            if not names:
                raise InputError(
                    "--templates is empty", hint="name at least one template, or drop --templates"
                )
        # Each language once: "en,en" would read every window twice, and the bootstrap would take
        # the copies for independent windows.
        langs = list(dict.fromkeys(split_names(options.lang) or LANGS))
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
        names = split_names(options.templates)
        if names:
            chosen_templates(loaded.is_causal, names)
        # what the windows and --why decide, refused before the first pass (the model's checks too)
        prepared = self.check(options)
        limit = options.windows or None
        once = list({source.name: source for source in prepared.eval_sources}.values())  # as describe_heads
        _check_eval_windows(balanced(windows(loaded, once, options.context), limit), prepared.eval_from)
        if options.why:
            from headscope.analyses.qk import _check_memory
            from headscope.capture.sources import refusal
            from headscope.errors import Unsupported

            reason = refusal(loaded)
            if reason is not None:
                raise Unsupported(
                    f"describe --why: {loaded.name} ({loaded.model.config.model_type}): {reason}",
                    hint="drop --why",
                )
            _check_memory(loaded, options.context + 1, loaded.layout.n_layers - 1)

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
            rows=options.rows or None,
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
        if options.why:
            _add_why(found, loaded, options, prepared, progress)
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
        from .present import SECTION_CSS, atlas_html, beside_html, card_templates

        atlas = result.atlas  # live, or read back from a saved result
        if atlas is None:
            return None
        other = getattr(result, "beside", None)  # a second model's result drawn beside this one
        beside = other.atlas if other is not None else None
        return (
            f"<style>{SECTION_CSS}</style>"
            + (beside_html(atlas, beside) if beside is not None else "")
            + atlas_html(atlas)
            + (card_templates(atlas, paint=True, beside=beside) or "")
        )


def _add_why(
    found: Atlas, loaded: Any, options: DescribeOptions, prepared: DescribeInputs, progress: Any
) -> None:
    """``--why``: every head's sources (``headscope qk``), ranked on the fit windows and measured on
    the evaluation windows the descriptions were measured on."""
    from headscope.analyses.qk import explain

    limit = options.windows or None
    pairs = []
    for sources in (prepared.fit_sources, prepared.eval_sources):
        texts = balanced(windows(loaded, sources, options.context), limit)
        pairs.append([(t.ids, t.special) for t in texts])
    result, _ = explain(
        loaded,
        pairs[0],
        pairs[1],
        prepared.eval_from,
        rows=options.rows or None,
        seed=options.seed,
        n_resamples=options.resamples,
        progress=progress,
    )
    found.set_why(result)
    found.notes.extend(result.notes)
