"""``induction``: the repeated-random-tokens protocol, with the loss on each copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headscope import detectors
from headscope.errors import InputError
from headscope.extend.ablation import ablate
from headscope.extend.ablation_present import ablation_json
from headscope.extend.base import (
    ProgressFactory,
    RepeatSpec,
    Report,
    model_batches,
    repeat_description,
    repeated_tokens,
    report_sections,
    score_batches,
)
from headscope.extend.checks import Check, check_repeat_context, one_check, too_many
from headscope.extend.copyloss import CopyLossMeter
from headscope.extend.protocol import (
    HELP_ABLATION,
    HELP_BATCH,
    HELP_DRAWS,
    Analysis,
    Outcome,
    Output,
    Repeat,
    Stats,
    check_common,
    option,
    register,
)
from headscope.models import LoadedModel
from headscope.verdicts.heads import top_heads
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import assign_roles
from headscope.verdicts.stats import check_resamples


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
    batches = model_batches(loaded, sequences, specials, batch_size)
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
        report_sections(results, {"repeated-tokens": repeat_description(spec)}),
        loaded.capture_mode,
        loss=meter.result() if meter else None,
        notes=notes + uncertainty_notes(results, n_resamples),
        results=results,
        inputs={"repeated-tokens": batches},
        repeat=(spec, offset),
        layout=loaded.layout,
    )


# --- the analysis: options, check, run, verify, JSON ------------------------------------------------


@dataclass(kw_only=True)
class InductionOptions(Repeat, Stats):
    bos: bool | None = option(
        None, "Prepend BOS (CLS/SEP for encoders). Default: when defined.", flag="--bos/--no-bos"
    )
    ablate: int = option(0, "Ablate the top-K induction heads and K random controls.", min=0)
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(5, HELP_DRAWS, min=1)
    batch_size: int = option(16, HELP_BATCH, min=1)


@register
class Induction(Analysis):
    name = "induction"
    summary = "Repeated random tokens: induction and duplicate-token heads, and loss on each copy."
    options = InductionOptions
    sweepable = True
    outputs = (
        Output(
            "--json",
            "Write the ablation result as JSON (atomic).",
            ablation_json,
            needs="ablate",
            refusal="--json writes the ablation result",
            hint="add --ablate K",
        ),
    )

    def check(self, options: InductionOptions) -> None:
        check_common(options)
        options.repeat_spec(options.seed, options.bos).validate()

    def check_loaded(self, loaded: Any, options: InductionOptions) -> None:
        check_repeat_context(loaded, options)
        if options.ablate:
            too_many(loaded, options.ablate, "ablate", "a random control of the same size")

    def run(self, loaded: Any, options: InductionOptions, prepared: None, progress: Any) -> Outcome:
        spec = options.repeat_spec(options.seed, options.bos)
        report = induction(
            loaded, spec, batch_size=options.batch_size, n_resamples=options.resamples, progress=progress
        )
        return Outcome(report, state={"spec": spec})

    def wants_verify(self, options: InductionOptions) -> bool:
        return options.ablate > 0

    def verify(
        self, loaded: Any, outcome: Outcome, options: InductionOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        too_many(
            loaded, k or options.ablate or 3, "k" if k else "ablate", "a random control of the same size"
        )
        k = k or options.ablate or 3
        heads = top_heads(outcome.report.table, "induction", k)
        effect = ablate(
            loaded,
            outcome.state["spec"],
            heads,
            mode=options.ablation,
            draws=options.draws,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            progress=progress,
        )
        return [Check("induction", effect)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"ablation": one_check(outcome, "induction")}
