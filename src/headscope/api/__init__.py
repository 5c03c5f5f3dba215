"""The public API: ``import headscope as hs``. The CLI, the sweep and the report use it too.

    import headscope as hs
    result = hs.scan(model, tokenizer)          # a model you loaded, or a spec: "smollm2-135m"
    result.top("induction", 5)
    result.verify(k=3)
    result                                      # in Jupyter: the report, inline and offline

Every analysis takes a model spec (alias, path, .gguf file, cached hub id), a ``LoadedModel``
from :func:`load`, or a ``transformers`` model object with its tokenizer, and the CLI's options
as keyword arguments with the same defaults. A model object is borrowed: its attention
implementation and train/eval mode are switched only while an analysis runs, and restored after,
also when the analysis fails. Its weights, device and dtype are never changed.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import headscope.analyses  # noqa: F401  (importing the package registers the analyses)
from headscope.analyses.describe.templates import Template
from headscope.api.result import AttentionMap, Result
from headscope.core.rolespec import RoleSpec
from headscope.detectors import Detector, PatternDetector, TargetDetector
from headscope.errors import InputError
from headscope.extend.base import ProgressFactory
from headscope.extend.checks import Check
from headscope.extend.protocol import (
    ANALYSES,
    Analysis,
    Outcome,
    Output,
    Stats,
    default_of,
    execute,
    flag_of,
    get,
    option,
)
from headscope.models import DEFAULT_MODEL, LoadedModel
from headscope.models.options import LoadOptions
from headscope.outputs.progress import progress_option
from headscope.outputs.views import ShowOptions
from headscope.sweeps.options import Recompute, Resources, Store

KEYWORD = inspect.Parameter.KEYWORD_ONLY


def declared(*groups: type, more: bool = False) -> Callable[[Callable], Callable]:
    """A function that takes its options as ``**options`` shows the fields of ``groups`` (option
    dataclasses: :class:`LoadOptions`, :class:`ShowOptions`, …) as its keyword parameters, with their
    defaults, before its own; so each keyword is declared once, where its help and checks are.
    ``more``: its ``**options`` takes other names too (an analysis' options)."""

    def decorate(fn: Callable) -> Callable:
        params = list(inspect.signature(fn).parameters.values())
        before = [p for p in params if p.kind not in (KEYWORD, inspect.Parameter.VAR_KEYWORD)]
        after = [p for p in params if p.kind is KEYWORD]
        rest = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD and more]
        taken = {p.name for p in before}  # a field the function takes by position (hs.sweep's out)
        fields = [f for group in groups for f in dataclasses.fields(group) if f.name not in taken]
        keywords = [
            inspect.Parameter(f.name, KEYWORD, default=default_of(f), annotation=f.type) for f in fields
        ]
        returns = inspect.signature(fn).return_annotation
        signature = inspect.Signature([*before, *keywords, *after, *rest], return_annotation=returns)
        fn.__signature__ = signature  # type: ignore[attr-defined]
        return fn

    return decorate


def _take(options: dict[str, Any], group: type) -> dict[str, Any]:
    """The values in ``options`` of ``group``'s fields, taken out of ``options``."""
    return {f.name: options.pop(f.name) for f in dataclasses.fields(group) if f.name in options}


def _no_more(function: str, options: dict[str, Any]) -> None:
    if options:
        raise TypeError(f"{function}() got an unexpected keyword argument {next(iter(options))!r}")


@declared(LoadOptions)
def load(
    model: Any = DEFAULT_MODEL, tokenizer: Any = None, *, name: str | None = None, **options: Any
) -> LoadedModel:
    """A model ready for analyses.

    ``model`` is a spec (a bundled alias such as ``"smollm2-135m"``, a local folder, a ``.gguf``
    file, or a hub id already in the local cache; ``device`` default cpu, ``dtype`` default
    float32), or a loaded ``transformers`` model, which needs its ``tokenizer`` and is used where
    and as it is (``device``, ``dtype`` and ``device_map`` are for specs). ``capture`` is auto,
    stream or eager.
    """
    loads = _take(options, LoadOptions)
    _no_more("load", options)
    chosen = LoadOptions(**loads)
    if isinstance(model, LoadedModel):
        given = [n for n in chosen.given() if n != "capture"] + (
            ["tokenizer"] if tokenizer is not None else []
        )
        if chosen.capture != "auto":
            given.append("capture")
        if given:
            raise InputError(
                f"{', '.join(given)}: {model.name} is already loaded (capture={model.capture_mode})",
                hint="pass them to hs.load when loading it",
            )
        return model
    if isinstance(model, str | os.PathLike):
        if tokenizer is not None:
            raise InputError(
                "tokenizer= goes with a model object; a model spec loads its own tokenizer",
                hint="drop tokenizer=, or pass the loaded model object",
            )
        from headscope.models import load as load_spec

        return load_spec(os.fspath(model), **chosen.for_spec())
    given = [n for n in chosen.given() if n != "capture"]
    if given:
        raise InputError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a model spec; a model object is "
            "analysed where and as it is",
            hint="move or cast it yourself (model.to(...)) before hs.load",
        )
    from headscope.models.wrap import wrap

    return wrap(model, tokenizer, capture=chosen.capture, name=name)  # type: ignore[arg-type]


def _load_timed(
    model: Any, tokenizer: Any, loads: dict[str, Any], on_loaded: Callable[[LoadedModel], None] | None
) -> tuple[LoadedModel, float]:
    """hs.load, its seconds, and ``on_loaded(loaded)`` once it has loaded (hs.run's and hs.show's)."""
    started = time.perf_counter()
    loaded = load(model, tokenizer, **loads)
    seconds = time.perf_counter() - started
    if on_loaded is not None:
        on_loaded(loaded)
    return loaded, seconds


def plan(analysis: str, **options: Any) -> tuple[Any, Any]:
    """Check an analysis' options and read its data files, before any model loads.

    Returns ``(options, prepared)``; :func:`run` does this first, the CLI too."""
    chosen = get(analysis)
    values = chosen.make_options(options)
    return values, chosen.check(values)


def plan_options(analysis: str, options: Any) -> tuple[Any, Any]:
    """As :func:`plan`, for an options dataclass already built (the CLI builds it while parsing)."""
    return options, get(analysis).check(options)


@declared(LoadOptions, more=True)
def run(
    analysis: str,
    model: Any = DEFAULT_MODEL,
    tokenizer: Any = None,
    *,
    progress: bool | ProgressFactory | None = None,
    profile: bool = False,
    planned: tuple[Any, Any] | None = None,
    on_loaded: Callable[[LoadedModel], None] | None = None,
    **options: Any,
) -> Result:
    """Run one analysis by name (``"scan"``, ``"induction"``, …); see ``hs.scan`` and friends.

    ``profile=True``: the result's ``profile`` is the cost ledger (:class:`headscope.capture.ledger.Profile`):
    the seconds spent loading, and per step of the run its seconds and its cost as a multiple of a
    bare forward over the tokens its passes ran (measured after the run, on one batch per length)."""
    chosen = get(analysis)
    loads = _take(options, LoadOptions)
    if planned is not None and options:
        raise InputError(f"planned= already holds the options; drop {', '.join(sorted(options))}")
    if not chosen.takes_capture and loads.get("capture", "auto") != "auto":
        raise InputError(
            f"{analysis} chooses its own capture (its per-head writes need streaming)", hint="drop capture="
        )
    values, prepared = planned if planned is not None else plan(analysis, **options)
    from headscope.capture import ledger

    loaded, load_seconds = _load_timed(model, tokenizer, loads, on_loaded)
    with progress_option(progress) as advance, ledger.recording() if profile else nullcontext() as book:
        started = time.perf_counter()
        outcome = execute(chosen, loaded, values, prepared, advance)
        run_seconds = time.perf_counter() - started
    result = Result(analysis, outcome=outcome, options=values, loaded=loaded)
    if book is not None:
        result.profile = book.profile(loaded, load_seconds, outcome.report.timings, run_seconds)
    return result


LOAD_PARAMETERS = (
    *((f.name, f.default, str(f.type)) for f in dataclasses.fields(LoadOptions)),
    ("progress", None, "bool | Callable | None"),
    ("profile", False, "bool"),
)


def _analysis_function(name: str) -> Callable[..., Result]:
    """``hs.<name>``: the analysis' options as keyword arguments, with its defaults and help texts;
    the options an analysis names in ``positional`` also come after ``model, tokenizer``."""
    # Built-ins are read without loading plugins: this runs while headscope is imported, and a
    # plugin importing headscope must not be loaded halfway through its own import.
    analysis = ANALYSES.builtins().get(name) or ANALYSES[name]
    positional = tuple(getattr(analysis, "positional", ()))

    def function(model: Any = DEFAULT_MODEL, tokenizer: Any = None, *args: Any, **kwargs: Any) -> Result:
        if len(args) > len(positional):
            raise TypeError(f"{python_name(name)}() takes at most {2 + len(positional)} positional arguments")
        for key, value in zip(positional, args, strict=False):
            if key in kwargs:
                raise TypeError(f"{python_name(name)}() got {key} twice")
            kwargs[key] = value
        return run(name, model, tokenizer, **kwargs)

    by_position = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("model", by_position, default=DEFAULT_MODEL, annotation=Any),
        inspect.Parameter("tokenizer", by_position, default=None, annotation=Any),
    ]
    fields = {f.name: f for f in dataclasses.fields(analysis.options)}
    for key in positional:
        field = fields[key]
        params.append(inspect.Parameter(key, by_position, default=field.default, annotation=field.type))
    params += [inspect.Parameter(n, keyword, default=d, annotation=a) for n, d, a in LOAD_PARAMETERS]
    lines = []
    for field in fields.values():
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.name not in positional:
            params.append(inspect.Parameter(field.name, keyword, default=default, annotation=field.type))
        where = f" ({flag_of(field).split('/')[0]})" if analysis.cli else ""
        lines.append(f"    {field.name} = {default!r}{where}: {field.metadata['help']}")
    function.__signature__ = inspect.Signature(params, return_annotation="Result")  # type: ignore[attr-defined]
    function.__name__ = function.__qualname__ = python_name(name)
    function.__module__ = "headscope"
    form = (
        f"The Python form of ``headscope {name}``: a model spec, a ``LoadedModel`` or a model object with its "
        "tokenizer, then the command's options as keyword arguments, with its defaults.\n"
        if analysis.cli
        else "A model spec, a ``LoadedModel`` or a model object with its tokenizer, then the options below.\n"
    )
    function.__doc__ = (
        f"{analysis.summary}\n\n{form}"
        f"{', '.join(LoadOptions.names())}: how a spec is loaded (see ``hs.load``); progress: True for "
        "a progress bar; profile: True for the cost ledger (``result.profile``, see ``hs.run``).\n\nOptions:\n"
        + "\n".join(lines)
        + "\n\nReturns a :class:`headscope.Result`."
    )
    return function


def python_name(analysis: str) -> str:
    """``kv-plan`` -> ``kv_plan``: the analysis' function name in ``headscope``."""
    return analysis.replace("-", "_")


# One function per built-in analysis, derived from the registry (``hs.scan``, ``hs.kv_plan``, …);
# plugin and run-time analyses are found by the module's __getattr__ below.
ANALYSIS_FUNCTIONS = {python_name(name): _analysis_function(name) for name in ANALYSES.builtins()}
globals().update(ANALYSIS_FUNCTIONS)


def __getattr__(name: str) -> Any:
    analysis = name.replace("_", "-")
    if analysis in ANALYSES:
        return _analysis_function(analysis)
    raise AttributeError(f"module 'headscope.api' has no attribute {name!r}")


def register(declaration: Any) -> Any:
    """Add a detector, an analysis or a template for this process, as a plugin would: a
    :class:`headscope.TargetDetector` (or a ``Detector`` subclass) joins the scan, the role map, the
    legends and the reports; an ``Analysis`` subclass gets ``hs.<name>`` and ``hs.run``; an
    ``hs.Template`` joins the library ``hs.describe`` describes heads with. A name that a
    built-in or a plugin holds is refused, as are the names of headscope's own functions and
    commands for an analysis (``compare``, ``sweep``, …) and a role label that any other role
    already has; registering a name again replaces your earlier one. Safe to call from threads.
    Returns the declaration (so it works as a class decorator)."""
    from headscope import detectors
    from headscope.analyses.describe.templates import TEMPLATES, Template
    from headscope.extend.protocol import Analysis

    if isinstance(declaration, Template):
        TEMPLATES.register(declaration)
    elif isinstance(declaration, detectors.Detector) or (
        isinstance(declaration, type) and issubclass(declaration, detectors.Detector)
    ):
        detectors.REGISTRY.register(declaration)
    elif isinstance(declaration, Analysis) or (
        isinstance(declaration, type) and issubclass(declaration, Analysis)
    ):
        ANALYSES.register(declaration)
    else:
        raise InputError(
            f"hs.register takes a detector, an analysis or a template, got {type(declaration).__name__}",
            hint="hs.TargetDetector(...), a headscope.Detector subclass, a headscope.Analysis subclass, "
            "or hs.Template(...)",
        )
    return declaration


@declared(ShowOptions, LoadOptions)
def show(
    model: Any = DEFAULT_MODEL,
    tokenizer: Any = None,
    *,
    profile: bool = False,
    on_loaded: Callable[[LoadedModel], None] | None = None,
    **options: Any,
) -> AttentionMap:
    """Heads' attention on one text (``headscope show``): an :class:`AttentionMap` with ``weights``
    ``[heads, n, n]``, ``labels``, ``table`` and an inline heatmap. ``heads``: a number, a list, or "all".
    The text and heads are checked before the model loads; ``on_loaded(loaded)`` is called once it
    has. ``profile=True``: its ``profile`` is the cost ledger, as with :func:`run`."""
    from headscope.capture import prepared as borrowed
    from headscope.extend.show import check_request, show_attention

    # Checked by headscope.extend.show in its own words (check_request now, the layer once loaded).
    shown = ShowOptions(**_take(options, ShowOptions))
    loads = _take(options, LoadOptions)
    _no_more("show", options)
    heads = shown.heads
    head_text = ",".join(str(h) for h in heads) if isinstance(heads, list | tuple) else str(heads)
    check_request(shown.text, head_text, shown.words, shown.word_sep)
    from headscope.capture import ledger

    loaded, load_seconds = _load_timed(model, tokenizer, loads, on_loaded)
    with ledger.recording() if profile else nullcontext() as book:
        started = time.perf_counter()
        with borrowed(loaded):
            view = show_attention(
                loaded, shown.text, shown.layer, head_text, words=shown.words, word_sep=shown.word_sep
            )
        run_seconds = time.perf_counter() - started
    attention = AttentionMap(view, loaded.name)
    if book is not None:
        attention.profile = book.profile(loaded, load_seconds, {}, run_seconds)
    return attention


def compare(a: Any, b: Any) -> Any:
    """Two results side by side (``headscope compare``): ``a`` and ``b`` are ``Result`` objects, saved
    result JSON files or scan CSVs (a base model and its fine-tune, two checkpoints). Where both
    describe their heads (``hs.describe``, ``hs.scan``), ``descriptions`` lists the heads whose
    description changed (another dominant template, or mixtures 0.25 apart in total variation). Returns a ``Comparison``: ``tables``
    (per table: best heads, mean change, Spearman's rank correlation, roles gained and lost),
    ``joined`` (one row per head: score_a, score_b, delta, roles, change) and ``notes`` (tables
    found in one result only). Heads are paired by layer and head number: results of different
    layouts, or with no table in common, are refused."""
    from headscope.analyses.describe.atlas import compare_atlases
    from headscope.outputs.compare import compare as compare_frames
    from headscope.outputs.compare import read_scan_csv

    if isinstance(a, str | os.PathLike) and str(a).endswith(".json"):
        a = Result.from_json(a)
    if isinstance(b, str | os.PathLike) and str(b).endswith(".json"):
        b = Result.from_json(b)

    def frame(value: Any, label: str) -> Any:
        if isinstance(value, Result):
            table = value.table
            columns = ["model", "detector", "relation", "direction", "data", "layer", "head", "score"]
            missing = [c for c in [*columns, "ci_low", "ci_high", "role"] if c not in table.columns]
            if table.empty or missing:
                raise InputError(
                    f"compare: {label} (an hs.{value.analysis.replace('-', '_')} result) has no per-head "
                    "score table to compare",
                    hint="compare the results of analyses that score every head (scan, induction, detect, …)",
                )
            out = table[columns + ["ci_low", "ci_high", "role"]].copy()
            out["role"] = out["role"].fillna("")
            out["data"] = out["data"].fillna("")
            return out
        if isinstance(value, str | os.PathLike):
            return read_scan_csv(value)
        raise InputError(
            f"compare: {label} must be a headscope Result or a scan CSV, got {type(value).__name__}"
        )

    atlases = [value.atlas if isinstance(value, Result) else None for value in (a, b)]
    found = compare_frames(frame(a, "a"), frame(b, "b"))
    if atlases[0] is not None and atlases[1] is not None:
        found.descriptions = compare_atlases(atlases[0], atlases[1])
    elif any(atlas is not None for atlas in atlases):
        found.notes.append(
            "only one result describes its heads (describe's atlas): descriptions not compared"
        )
    else:
        bare = [
            label
            for label, value in (("A", a), ("B", b))
            if isinstance(value, Result) and value.analysis == "describe"
        ]
        if bare:
            found.notes.append(
                f"{' and '.join(bare)}: a describe result without its atlas (a sweep store written before "
                "headscope kept it): descriptions not compared; rerun the sweep to compare them"
            )
    return found


@declared(Store, Resources, Recompute, more=True)
def sweep(
    specs: list[str] | str,
    out: str | Path,
    *,
    on_result: Callable[[str, dict], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    **options: Any,
) -> Any:
    """Run analyses over many models or checkpoints into a resumable store (``headscope sweep``).

    ``options`` are the analyses' own (``seq_len``, ``tokens``, ``detectors``, ``resamples``, …),
    each given to every chosen analysis that declares it; where two declare a name with different
    meanings (``k``, ``text``, ``tasks``), say which: ``**{"icl.k": 7}``. An option no chosen
    analysis reads in a sweep (``ablate``, ``verify``: a sweep runs no causal check) is refused.
    Notes (a stored run computed again, and why) go to ``on_note`` and the result's ``notes``.
    Returns the sweep's result: ``table`` (sweep.csv), ``emergence()`` and ``across_models()``."""
    from headscope.extend.protocol import split_names
    from headscope.sweeps.run import sweep as run_sweep

    analyses = options.pop("analyses", "induction")
    own = _take(options, Resources) | _take(options, Recompute)
    return run_sweep(
        [specs] if isinstance(specs, str) else list(specs),
        Path(out),
        analyses=split_names(analyses) or [],
        options=options,
        on_result=on_result,
        on_note=on_note,
        **own,
    )


__all__ = [
    "Analysis",
    "AttentionMap",
    "Check",
    "Detector",
    "Outcome",
    "Output",
    "PatternDetector",
    "Result",
    "RoleSpec",
    "Stats",
    "TargetDetector",
    "Template",
    "compare",
    "load",
    "option",
    "plan",
    "plan_options",
    "register",
    "run",
    "show",
    "sweep",
    *ANALYSIS_FUNCTIONS,
]
