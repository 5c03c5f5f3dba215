"""The analyses behind ``hs.scan``, ``hs.induction``, … and the CLI's commands, one class each.

Each class is the protocol of :mod:`headscope.analyses.protocol` around the analysis' own module:
its options (with the CLI's defaults and help texts), ``check`` before the model loads, ``run``,
``verify`` and the JSON it adds to the tidy rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.errors import InputError, NotApplicable

from .protocol import (
    HELP_ABLATION,
    HELP_BATCH,
    HELP_DRAWS,
    HELP_SKIP_BAD,
    Analysis,
    Outcome,
    Repeat,
    Stats,
    check_common,
    option,
    register,
    split_names,
)


@dataclass
class Check:
    """One causal check: ``kind`` picks its printer in ``outputs``; ``value`` is the analysis' own record."""

    kind: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        if self.kind == "table":
            value = self.value
            return {
                **dataclasses.asdict(value),
                "topk_effect": value.topk_effect,
                "random_effect": value.random_effect,
            }
        return self.value.to_json()


def _one_check(outcome: Outcome, kind: str) -> dict[str, Any] | None:
    """The JSON of the analysis' one check of ``kind`` (None when it was not run)."""
    check = next((c for c in outcome.checks if c.kind == kind), None)
    return None if check is None else check.to_json()


def _too_many(loaded: Any, k: int, option_name: str, what: str) -> None:
    total = loaded.layout.n_layers * loaded.layout.n_heads
    if k > total // 2:
        raise InputError(
            f"{option_name} {k} leaves too few heads for {what}", hint=f"use at most {total // 2}"
        )


# --- scan -------------------------------------------------------------------------------------------


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
    weights: bool = option(
        True, "Also score the weight-only roles (copy, supp, succ).", flag="--weights/--no-weights"
    )
    role_threshold: float = option(0.3, "Minimum score for a role.")
    role_margin: float = option(0.05, "ci_low must clear the baseline by this much.")
    alpha: float = option(0.05, "False discovery rate for roles (Benjamini–Hochberg).", min=0.0, max=1.0)


@register
class Scan(Analysis):
    name = "scan"
    summary = "Score every head with every detector, print the top heads of each and the role map."
    options = ScanOptions
    json_roles = True
    spaced_checks = True

    def check(self, options: ScanOptions) -> dict[str, Any]:
        from headscope import detectors
        from headscope.data.prompts import builtin, load_texts
        from headscope.verdicts.roles import RoleRule

        from .scan import DEFAULT_TEXT_SET

        check_common(options)
        if not 0.0 <= options.alpha <= 1.0:
            raise InputError(f"--alpha must be between 0 and 1, got {options.alpha}")
        names = split_names(options.detectors)
        if names is not None and not names:
            if isinstance(options.detectors, str) and not options.detectors.strip():
                names = None  # --detectors "" means all, as it always did
            else:
                raise InputError("--detectors names no detector", hint="leave it out for all of them")
        weights = options.weights
        if names is not None:
            # "weights" names the weight-only roles; the rest are attention detectors.
            weights = weights and "weights" in names
            names = [n for n in names if n != "weights"]
            detectors.create(names)  # reject unknown names before loading anything
        options.repeat_spec(options.seed).validate()
        text = options.text if options.text is not None else builtin(DEFAULT_TEXT_SET)
        return {
            "names": names,
            "weights": weights,
            "text_set": load_texts(text),
            "rule": RoleRule(
                threshold=options.role_threshold, margin=options.role_margin, alpha=options.alpha
            ),
        }

    def run(self, loaded: Any, options: ScanOptions, prepared: dict[str, Any], progress: Any) -> Outcome:
        from .scan import scan

        report = scan(
            loaded,
            text_set=prepared["text_set"],
            repeat=options.repeat_spec(options.seed),
            detector_names=prepared["names"],
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            role_rule=prepared["rule"],
            progress=progress,
            include_weights=prepared["weights"],
        )
        return Outcome(report, state={"rule": prepared["rule"], "verified": False})

    def wants_verify(self, options: ScanOptions) -> bool:
        return options.verify

    def verify(
        self, loaded: Any, outcome: Outcome, options: ScanOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        """Token-loss ablation of every table, then the circuit tables by their own measures."""
        from .ablation import verify as verify_tables

        k = k or options.verify_k
        report = outcome.report
        outcome.state.update(verified=True, k=k)
        checks = [
            Check("table", c)
            for c in verify_tables(loaded, report, k=k, seed=options.seed, progress=progress)
        ]
        return checks + _verify_circuits(loaded, report, k, options.seed, progress)

    def json(self, outcome: Outcome) -> dict[str, Any]:
        tables = [c.to_json() for c in outcome.checks if c.kind == "table"]
        circuits = [c.to_json() for c in outcome.checks if c.kind != "table"]
        return {
            "role_rule": outcome.state["rule"].describe(),
            "verification": tables if outcome.state.get("verified") else None,
            "circuit_verification": circuits or None,
        }


def _verify_circuits(loaded: Any, report: Any, k: int, seed: int, progress: Any) -> list[Check]:
    """The circuit tables of a scan: name movers by logit difference, retrieval heads by needle
    accuracy, successor heads by ordinal continuations. Each outcome names its own check."""
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
            from headscope.verdicts.heads import top_heads

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


# --- induction --------------------------------------------------------------------------------------


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

    def check(self, options: InductionOptions) -> None:
        check_common(options)
        options.repeat_spec(options.seed, options.bos).validate()
        if options.ablate < 0:
            raise InputError(f"--ablate must be at least 0, got {options.ablate}")

    def run(self, loaded: Any, options: InductionOptions, prepared: Any, progress: Any) -> Outcome:
        from .induction import induction

        if options.ablate:
            _too_many(loaded, options.ablate, "--ablate", "a random control of the same size")
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
        from headscope.verdicts.heads import top_heads

        from .ablation import ablate

        k = k or options.ablate or 3
        _too_many(loaded, k, "--ablate", "a random control of the same size")
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
        return {"ablation": _one_check(outcome, "induction")}


# --- syntax and coref -------------------------------------------------------------------------------


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


class _TableChecked(Analysis):
    """Analyses whose tables ``Result.verify`` checks by token-loss ablation, as ``scan --verify`` does."""

    def verify(
        self, loaded: Any, outcome: Outcome, options: Any, progress: Any, k: int | None = None
    ) -> list[Check]:
        from .ablation import verify as verify_tables

        checks = verify_tables(loaded, outcome.report, k=k or 3, seed=options.seed, progress=progress)
        return [Check("table", c) for c in checks]


@register
class Syntax(_TableChecked):
    name = "syntax"
    summary = (
        "Syntactic heads: per relation and direction, the best head against the best positional baseline."
    )
    options = SyntaxOptions

    def check(self, options: SyntaxOptions) -> dict[str, Any]:
        from headscope.data.conllu import read_conllu
        from headscope.data.prompts import builtin

        from .scan import DEFAULT_TREEBANKS
        from .syntax import check_relations

        check_common(options)
        if options.limit is not None and options.limit < 1:
            raise InputError(f"--limit must be at least 1, got {options.limit}")
        source = options.treebank if options.treebank is not None else builtin(DEFAULT_TREEBANKS[0])
        parsed = read_conllu(source, skip_bad=options.skip_bad, limit=options.limit)
        wanted = split_names(options.relations) or None
        check_relations(parsed, wanted)
        return {"treebank": parsed, "relations": wanted}

    def run(self, loaded: Any, options: SyntaxOptions, prepared: dict[str, Any], progress: Any) -> Outcome:
        from .syntax import syntax

        report = syntax(
            loaded,
            prepared["treebank"],
            relations=prepared["relations"],
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(report)


@dataclass(kw_only=True)
class CorefOptions(Stats):
    data: str | Path | None = option(
        None, "Coreference set, YAML or JSONL (default: the shipped English set).", cli_type=Path | None
    )
    skip_bad: bool = option(False, HELP_SKIP_BAD)
    batch_size: int = option(8, HELP_BATCH, min=1)


@register
class Coref(_TableChecked):
    name = "coref"
    summary = "Coreference heads: does the pronoun attend most to its antecedent?"
    options = CorefOptions

    def check(self, options: CorefOptions) -> Any:
        from headscope.data.prompts import builtin, load_coref

        from .scan import DEFAULT_COREF_SETS

        check_common(options)
        data = options.data if options.data is not None else builtin(DEFAULT_COREF_SETS[0])
        return load_coref(data, skip_bad=options.skip_bad)

    def run(self, loaded: Any, options: CorefOptions, prepared: Any, progress: Any) -> Outcome:
        from .coref import coref

        report = coref(
            loaded,
            prepared,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(report)


# --- retrieval --------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Needles:
    """The needle prompts' data, for retrieval and kv-plan."""

    data: str | Path | None = option(
        None,
        "Needles, YAML or JSONL: needle, question, answer (default: the shipped English set).",
        cli_type=Path | None,
    )
    haystack: str | Path | None = option(
        None,
        "Filler text: .txt, or .conllu (its # text lines). Default: the shipped one for the needles' language.",
        cli_type=Path | None,
    )


def _needle_inputs(options: Any, check_contexts: Any = None) -> dict[str, Any]:
    """Contexts, depths, the needle set (its first ``options.needles``, when set) and the haystack,
    read and checked before the model loads; ``check_contexts(contexts)`` runs before any file is read."""
    from headscope.data.circuits import load_haystack, load_retrieval
    from headscope.data.prompts import builtin

    from . import retrieval as needle

    contexts = needle.parse_contexts(_joined(options.context))
    depths = needle.parse_depths(_joined(options.depths))
    if check_contexts is not None:
        check_contexts(contexts)
    needle_set = load_retrieval(options.data if options.data is not None else builtin("retrieval/en.yaml"))
    if options.needles:
        needle_set.items = needle_set.items[: options.needles]
    haystack = options.haystack
    if haystack is None:
        haystack = builtin(f"retrieval/haystack-{needle.language_of(needle_set)}.txt")
    return {
        "needles": needle_set,
        "haystack": load_haystack(haystack),
        "contexts": contexts,
        "depths": depths,
    }


@dataclass(kw_only=True)
class RetrievalOptions(Needles, Stats):
    context: str | int | list[int] = option(
        "1000", "Prompt lengths in tokens, comma-separated (e.g. 1000,2000).", cli_type=str
    )
    depths: str | list[float] = option(
        "0,0.25,0.5,0.75,1",
        "Where the needle goes: fractions of the context, 0 = start, 1 = end.",
        cli_type=str,
    )
    needles: int | None = option(None, "Use only the first N needles (default: all).", min=1)
    ablate: int = option(0, "Ablate the top-K retrieval heads and K random same-layer heads.", min=0)
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(3, HELP_DRAWS, min=1)
    batch_size: int = option(2, "Prompts per forward pass.", min=1)


def _joined(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else ",".join(str(v) for v in ([value] if not isinstance(value, list | tuple) else value))
    )


@register
class Retrieval(Analysis):
    name = "retrieval"
    summary = (
        "Needle in a haystack: needle accuracy by context and depth, and the heads that copy the needle."
    )
    options = RetrievalOptions
    takes_capture = False

    def check(self, options: RetrievalOptions) -> dict[str, Any]:
        check_common(options)
        if options.needles is not None and options.needles < 1:
            raise InputError(f"--needles must be at least 1, got {options.needles}")
        return _needle_inputs(options)

    def run(self, loaded: Any, options: RetrievalOptions, prepared: dict[str, Any], progress: Any) -> Outcome:
        from . import retrieval as needle

        if not (loaded.is_causal and loaded.has_lm_head):
            raise InputError(
                f"{loaded.name} is not a causal language model; retrieval reads its next-token predictions"
            )
        if options.ablate:
            _too_many(loaded, options.ablate, "--ablate", "a random control")
        report, outcome, prompts, batches = needle.retrieval(
            loaded,
            prepared["needles"],
            prepared["haystack"],
            contexts=prepared["contexts"],
            depths=prepared["depths"],
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        state = {"needle": outcome, "prompts": prompts, "batches": batches, "title": prepared["needles"].name}
        return Outcome(report, state=state)

    def wants_verify(self, options: RetrievalOptions) -> bool:
        return options.ablate > 0

    def verify(
        self, loaded: Any, outcome: Outcome, options: RetrievalOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        from headscope.verdicts.heads import top_heads

        from .retrieval import ablate_retrieval

        k = k or options.ablate or 3
        _too_many(loaded, k, "--ablate", "a random control")
        heads = top_heads(outcome.report.table, "retrieval", k)
        state = outcome.state
        effect = ablate_retrieval(
            loaded,
            state["prompts"],
            state["batches"],
            heads,
            state["needle"],
            mode=options.ablation,
            draws=options.draws,
            seed=options.seed,
            progress=progress,
        )
        return [Check("retrieval", effect)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"ablation": _one_check(outcome, "retrieval")}


# --- kv-plan ----------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class KVPlanOptions(Needles, Stats):
    sparsity: str | float | list[float] = option(
        "0.25,0.5,0.75",
        "Shares of the candidate KV heads made streaming, comma-separated, each in [0, 1].",
        cli_type=str,
    )
    sink: int = option(64, "Attention-sink tokens a streaming head keeps (DuoAttention deploys 64).")
    recent: int = option(
        256, "Recent tokens a streaming head keeps, the query's own included (DuoAttention: 256)."
    )
    method: str = option(
        "retrieval",
        "What ranks the KV heads: retrieval score (ties: long-range mass), long-range attention mass, "
        "or leave-one-out ablation (one needle pass per KV head).",
        choices=("retrieval", "mass", "ablation"),
    )
    compare: bool = option(
        False,
        "Also apply the plans that the run's other scores make, against the same random plans.",
    )
    text: str | Path | None = option(
        None,
        "Long natural text (.txt or .conllu) for the long-range mass and the LM loss (default: the haystack).",
        cli_type=Path | None,
    )
    context: str | int | list[int] = option(
        "1280",
        "Prompt lengths in tokens, comma-separated; at least 4 x (sink + recent) to test the window.",
        cli_type=str,
    )
    depths: str | list[float] = option(
        "0.1,0.4,0.7", "Needle depths: fractions of the context, 0 = start, 1 = end.", cli_type=str
    )
    needles: int | None = option(8, "Use only the first N needles (default 8; 0 or none: all).", min=0)
    text_chunks: int = option(3, "Stretches of natural text of the context length, per context.", min=1)
    draws: int = option(3, "Random plans per sparsity (all same-size plans when there are no more).", min=1)
    kv_dtype: str = option(
        "auto",
        "The cache's dtype for the memory figures (auto: the model's).",
        choices=("auto", "float32", "bfloat16", "float16", "int8"),
    )
    batch_size: int = option(2, "Prompts per forward pass.", min=1)


@register
class KVPlan(Analysis):
    name = "kv-plan"
    summary = (
        "A KV-cache plan: which KV heads need the whole context and which only a sink and a recent window, "
        "checked against random plans."
    )
    options = KVPlanOptions
    takes_capture = False
    print_sections = False

    def check(self, options: KVPlanOptions) -> dict[str, Any]:
        from headscope.data.circuits import load_haystack

        from . import kvplan

        check_common(options)
        sparsities = kvplan.parse_sparsities(_joined(options.sparsity))
        prepared = _needle_inputs(
            options, lambda contexts: kvplan.check_window(options.sink, options.recent, contexts)
        )
        text = prepared["haystack"] if options.text is None else load_haystack(options.text)
        return {**prepared, "sparsities": sparsities, "text": text}

    def run(self, loaded: Any, options: KVPlanOptions, prepared: dict[str, Any], progress: Any) -> Outcome:
        from . import kvplan

        dtype = options.kv_dtype
        if dtype == "auto":
            dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
            dtype = dtype if dtype in kvplan.KV_DTYPES else "float32"
        scored = kvplan.score(
            loaded,
            prepared["needles"],
            prepared["haystack"],
            prepared["text"],
            contexts=prepared["contexts"],
            depths=prepared["depths"],
            sink=options.sink,
            recent=options.recent,
            method=options.method,
            text_chunks=options.text_chunks,
            kv_dtype=dtype,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(scored.report, state={"scored": scored, "sparsities": prepared["sparsities"]})

    def wants_verify(self, options: KVPlanOptions) -> bool:
        return True  # the plan is not a plan until it is applied and compared with random ones

    def verify(
        self, loaded: Any, outcome: Outcome, options: KVPlanOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        from . import kvplan

        plan = kvplan.verify(
            loaded,
            outcome.state["scored"],
            outcome.state["sparsities"],
            draws=options.draws,
            seed=options.seed,
            progress=progress,
            compare=options.compare,
        )
        return [Check("kv-plan", plan)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"kv_plan": _one_check(outcome, "kv-plan")}


# --- ioi --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class IOIOptions(Stats):
    data: str | Path | None = option(
        None,
        "IOI prompts, YAML or JSONL: text, io, s (default: the shipped English set).",
        cli_type=Path | None,
    )
    verify: bool = option(
        False, "Ablate the name movers and random same-layer heads; report the logit difference."
    )
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(3, HELP_DRAWS, min=1)
    patch: bool = option(
        True, "Find S-inhibition heads by path patching (the slow part).", flag="--patch/--no-patch"
    )
    batch_size: int = option(8, HELP_BATCH, min=1)


@register
class IOI(Analysis):
    name = "ioi"
    summary = "Indirect object identification: name movers, negative name movers and S-inhibition heads."
    options = IOIOptions
    takes_capture = False

    def check(self, options: IOIOptions) -> Any:
        from headscope.data.circuits import load_ioi
        from headscope.data.prompts import builtin

        check_common(options)
        return load_ioi(options.data if options.data is not None else builtin("ioi/en.yaml"))

    def run(self, loaded: Any, options: IOIOptions, prepared: Any, progress: Any) -> Outcome:
        from .ioi import ioi

        report, _, _ = ioi(
            loaded,
            prepared,
            batch_size=options.batch_size,
            n_resamples=options.resamples,
            seed=options.seed,
            patch=options.patch,
            progress=progress,
        )
        return Outcome(report, state={"data": prepared.name})

    def wants_verify(self, options: IOIOptions) -> bool:
        return options.verify

    def verify(
        self, loaded: Any, outcome: Outcome, options: IOIOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        from .ioi import verify_ioi

        check = verify_ioi(
            loaded,
            outcome.report,
            outcome.state["data"],
            mode=options.ablation,
            draws=options.draws,
            seed=options.seed,
        )
        if check is None:
            outcome.report.notes.append("--verify: no name movers to ablate")
            return []
        return [Check("ioi", check)]

    def json(self, outcome: Outcome) -> dict[str, Any]:
        return {"verification": _one_check(outcome, "ioi")}


# --- weights ----------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class WeightsOptions(Stats):
    tokens: int = option(2000, "Ordinary tokens sampled (seeded) for the copying and suppression tests.")
    k: int = option(5, "Top-k (bottom-k) the own token must reach.")
    embedding: str = option(
        "mlp0", "What a head reads: mlp0 (effective embedding after block 0, the default) or raw."
    )
    tasks: list[Path] | None = option(
        None,
        "Ordinal task file(s), YAML (default: the shipped English and Chinese sets).",
        cli_type=list[Path] | None,
    )
    verify: bool = option(
        False,
        "Ablate the top successor heads and random same-layer heads on ordinal continuation prompts.",
    )
    verify_k: int = option(3, "Successor heads ablated by --verify.", min=1)
    ablation: str = option("zero", HELP_ABLATION, choices=("zero", "mean"))
    draws: int = option(3, HELP_DRAWS, min=1)


@register
class Weights(Analysis):
    name = "weights"
    summary = "Roles from the weights alone: OV copying, copy suppression and successor heads (no prompts)."
    options = WeightsOptions
    takes_capture = False
    spaced_checks = True

    def check(self, options: WeightsOptions) -> Any:
        from .weights import check_options, load_task_sets

        check_common(options)
        check_options(options.tokens, options.k, options.embedding)
        from headscope.weightroles.tasks import check_distinct_sets

        tasks = options.tasks
        if isinstance(tasks, str | Path):
            tasks = [tasks]
        task_sets = load_task_sets(tasks)
        check_distinct_sets(task_sets)
        return task_sets

    def run(self, loaded: Any, options: WeightsOptions, prepared: Any, progress: Any) -> Outcome:
        from .weights import weights

        if not loaded.has_lm_head:
            raise NotApplicable(
                f"{loaded.name} has no LM head: the OV token tests read logits through the unembedding, "
                "so there is nothing to score"
            )
        report = weights(
            loaded,
            tokens=options.tokens,
            k=options.k,
            embedding=options.embedding,
            task_sets=prepared,
            n_resamples=options.resamples,
            seed=options.seed,
            progress=progress,
        )
        return Outcome(report, state={"tasks": [t.name for t in prepared]})

    def wants_verify(self, options: WeightsOptions) -> bool:
        return options.verify

    def verify(
        self, loaded: Any, outcome: Outcome, options: WeightsOptions, progress: Any, k: int | None = None
    ) -> list[Check]:
        from .weights import verify_successor

        checks = []
        for name in outcome.state["tasks"]:
            check = verify_successor(
                loaded,
                outcome.report,
                name,
                k=k or options.verify_k,
                mode=options.ablation,
                draws=options.draws,
                seed=options.seed,
            )
            if check is None:
                outcome.report.notes.append(f"--verify: {name}: no successor pairs to test")
            else:
                checks.append(Check("successor", check))
        return checks
