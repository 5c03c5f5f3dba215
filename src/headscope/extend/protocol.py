"""One protocol for every analysis, and the options each declares once.

An analysis is a small class with:

* ``options``: a dataclass of its options. Each field's default is the CLI's default and its
  metadata carries the one help text (and the flag name), so the Python API, the CLI and the
  sweep read the same declaration;
* ``check(options) -> Prepared``: every bad input is refused here, before a model loads. Data
  files are read and validated here, and handed to ``run``;
* ``run(loaded, options, prepared, progress) -> Outcome``: the report and what the verification
  needs;
* ``verify(loaded, outcome, options, progress) -> list``: the causal checks (ablations); each
  check has a ``kind``, a ``to_json()``, and its value prints itself (``print_to(console, top)``);
* ``json(outcome)``: what it adds to the result JSON beyond the tidy rows.

The registry (:data:`ANALYSES`) serves the API (``hs.scan``, …), the CLI and the sweep executors.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from headscope.core import held
from headscope.core.registry import Registry
from headscope.errors import InputError
from headscope.verdicts.stats import MIN_RESAMPLES, check_resamples

from .base import ProgressFactory, RepeatSpec, Report


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    min: float | None = None,
    max: float | None = None,
    choices: Sequence[str] | None = None,
    cli_type: Any = None,
    check: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field that carries its CLI declaration: flag, help text, range, choices.

    ``check(value)`` raises a HeadscopeError for a bad value; the CLI runs it while parsing."""
    meta = {
        "help": help,
        "flag": flag,
        "min": min,
        "max": max,
        "choices": choices,
        "cli_type": cli_type,
        "check": check,
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def default_of(f: dataclasses.Field) -> Any:
    """The default an option's keyword or flag shows: a fresh value of its factory, or
    ``inspect.Parameter.empty`` where it has none (a required option)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


# Who is asking: "python" (hs.scan(..., seq_len=1)) or "cli" (headscope scan --seq-len 1). A refusal
# names an option as the caller spelled it; the CLI sets this while it runs an analysis.
ENTRY: ContextVar[str] = ContextVar("headscope_entry", default="python")


def spelled(name: str, value: Any) -> str:
    """An option and its value as the caller wrote them: ``verify_k=9`` from Python, ``--verify-k 9``
    from the command line."""
    if ENTRY.get() == "cli":
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            return f"--{flag}" if value else f"--no-{flag}"
        return f"--{flag} {value}"
    return f"{name}={value!r}"


# Help texts written once (they drifted when every command wrote its own).
HELP_RESAMPLES = f"Bootstrap resamples for the 95% intervals: at least {MIN_RESAMPLES}, or 0 for no intervals and no roles."
HELP_SEED = "Seed for random tokens and bootstrap resampling."
HELP_BATCH = "Sequences per forward pass."
HELP_DRAWS = "Random-control draws for the ablation."
HELP_ABLATION = (
    "Replace ablated head outputs by zeros, or by their per-position mean over the whole set "
    "(one extra calibration pass)."
)
HELP_SKIP_BAD = "Skip malformed sentences/examples (and count them) instead of stopping."


@dataclass(kw_only=True)
class Stats:
    resamples: int = option(1000, HELP_RESAMPLES, check=check_resamples)
    seed: int = option(0, HELP_SEED, check=lambda value: check_seed(value))


@dataclass(kw_only=True)
class Repeat:
    seq_len: int = option(
        50, "Random tokens per copy (at least 2: a token needs a successor before its repeat).", min=2
    )
    repeat_seq: int = option(2, "Copies of each random sequence.", min=2)
    n_seqs: int = option(16, "Number of random sequences.", flag="--batch", min=1)

    def repeat_spec(self, seed: int, bos: bool | None = None) -> RepeatSpec:
        return RepeatSpec(
            seq_len=self.seq_len, repeats=self.repeat_seq, n_seqs=self.n_seqs, seed=seed, bos=bos
        )


@dataclass
class Outcome:
    """What ``run`` returns: the report, and whatever the verification and the JSON need."""

    report: Report
    state: dict[str, Any] = field(default_factory=dict)
    checks: list[Any] = field(default_factory=list)
    extra_json: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Output:
    """A file or folder an analysis' command writes besides ``--csv`` and ``-o`` (``--html``,
    ``--png``, ``--out``): its flag and help text, and its writer ``writer(result, path, force)``,
    kept beside the analysis (:mod:`headscope.extend.writers` holds the shared ones); a name
    (``"html"``) picks a built-in's named writer (``headscope.outputs.writing.WRITERS``).

    ``needs`` names an option this output needs (``--json`` writes the ablation: ``ablate``); when
    it is not set the command stops, before the model loads, with ``refusal`` (default: "--json
    needs --ablate") and ``hint``."""

    flag: str
    help: str
    writer: str | Callable[[Any, Path, bool], None]
    # "file": checked with --csv and -o before the model loads; "folder": its writer's own check.
    kind: str = "file"
    needs: str | None = None
    refusal: str = ""
    hint: str | None = None
    # Listed right after the analysis' options (the run's figure or plan), not after --csv.
    first: bool = False


class Analysis:
    """The protocol. Subclasses set ``name``, ``options`` and override the steps."""

    name: ClassVar[str]
    summary: ClassVar[str]
    options: ClassVar[type]
    # Load options the command takes: capture is fixed to auto where DLA or hooks need streaming.
    takes_capture: ClassVar[bool] = True
    # The result JSON carries the role table (one row per head), as scan's does.
    json_roles: ClassVar[bool] = False
    # Rendering: a blank line after each check (several checks in a row), the role map (scan).
    spaced_checks: ClassVar[bool] = False
    # The per-head tables of the report in the terminal (kv-plan prints its own per-KV-head table
    # instead; the per-head rows stay in --csv and --format json).
    print_sections: ClassVar[bool] = True
    # A sweep can run it: its result is one tidy table per model, from short prompts.
    sweepable: ClassVar[bool] = False
    # The command's shared options: --top (heads per table; syntax shows every relation's best).
    takes_top: ClassVar[bool] = True
    # The files or folders the command writes besides --csv and -o (see Output).
    outputs: ClassVar[tuple[Output, ...]] = ()
    # It has a command (headscope NAME); False where an option is not a command-line value (hs.detect's
    # patterns are tensors or functions).
    cli: ClassVar[bool] = True
    # Its html_section draws a second result of this analysis beside the first (``result.beside``:
    # describe, two models' atlases on one page); no other pair of results can share a page.
    draws_beside: ClassVar[bool] = False

    def option_names(self) -> set[str]:
        """The names of the options this analysis declares."""
        return {f.name for f in dataclasses.fields(self.options)}

    def take(self, values: dict[str, Any]) -> Any:
        """Options from the values this analysis declares, the others left for other analyses (a sweep)."""
        return self.make_options({k: v for k, v in values.items() if k in self.option_names()})

    def make_options(self, values: dict[str, Any]) -> Any:
        """Options from keyword arguments; an unknown name is an error that lists the known ones."""
        known = self.option_names()
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(
                f"{self.name}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                hint=f"known: {', '.join(sorted(known))}",
            )
        hints = typing.get_type_hints(self.options)
        checked = {}
        for declared in dataclasses.fields(self.options):
            if declared.name in values:
                name = declared.name
                checked[name] = check_value(self.name, declared, hints[name], values[name])
        return self.options(**checked)

    def check(self, options: Any) -> Any:
        check_common(options)
        return None

    def check_loaded(self, loaded: Any, options: Any) -> None:
        """What can be checked from the loaded model's layout alone (its context, its heads), before
        the first forward pass: refuse here rather than after minutes of scoring."""
        return None

    def views(self, loaded: Any, options: Any) -> tuple[str, ...]:
        """The decompositions this run reports from (``maps``, ``dla``, ``ov``): each is checked on
        the model itself before the run (:func:`headscope.capture.checks.require`)."""
        return ("maps",)

    def run(self, loaded: Any, options: Any, prepared: Any, progress: ProgressFactory | None) -> Outcome:
        raise NotImplementedError

    # --- presentation: what the analysis shows beyond the generic tables, beside its own code ---
    def present(self, result: Any, console: Any, top: int) -> None:
        """Print what this analysis adds for people after the generic tables and checks (a rich
        ``Console``; ``top``: the command's --top). Nothing by default."""
        return None

    def html_section(self, result: Any) -> str | None:
        """This analysis' own section of the HTML report (an HTML fragment), or None."""
        return None

    def wants_verify(self, options: Any) -> bool:
        """Whether the options ask for the causal check (--verify, --ablate K)."""
        return bool(getattr(options, "verify", False))

    def json(self, outcome: Outcome) -> dict[str, Any]:
        """What the result JSON adds beyond the tidy rows (None values are left out): by default the
        checks, as ``verification``."""
        return {"verification": [c.to_json() for c in outcome.checks] or None}

    def verify(
        self,
        loaded: Any,
        outcome: Outcome,
        options: Any,
        progress: ProgressFactory | None,
        k: int | None = None,
    ) -> list[Any]:
        """The causal checks of this analysis; none by default (the result says so in a note)."""
        outcome.report.notes.append(f"{self.name}: no causal check is defined for this analysis")
        return []


def _accepts(kind: Any, value: Any) -> tuple[bool, Any]:
    """(whether ``value`` fits the annotation ``kind``, the value as the option holds it)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        for member in typing.get_args(kind):
            ok, converted = _accepts(member, value)
            if ok:
                return True, converted
        return False, value
    if kind is type(None):
        return value is None, value
    if kind is bool:
        return isinstance(value, bool), value
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if kind is str:
        return isinstance(value, str), value
    if kind is Path:
        return isinstance(value, str | os.PathLike), value
    if origin is list:
        if not isinstance(value, list | tuple):
            return False, value
        (member,) = typing.get_args(kind) or (Any,)
        converted = []
        for item in value:
            ok, item = _accepts(member, item) if member is not Any else (True, item)
            if not ok:
                return False, value
            converted.append(item)
        return True, converted
    return True, value


def _describe(kind: Any) -> str:
    text = str(kind).replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")
    return re.sub(r"<class '(\w+)'>", r"\1", text)


def check_value(analysis: str, field: dataclasses.Field, kind: Any, value: Any, *, cli: bool = False) -> Any:
    """One option value checked against its annotation, range, choices and its own ``check``: the
    one place every entry (API, CLI, sweep, plugin) checks an option. InputError naming the keyword
    (``scan: role_threshold=nan``), or, from the CLI (``cli``), the value after typer's "--flag"."""
    ok, value = _accepts(kind, value)
    where = f"{value}" if cli else f"{analysis}: {field.name}={value!r}"
    hint = None if cli else f"{flag_of(field)}: {field.metadata['help']}"
    if not ok:
        number = {int, float} & set(typing.get_args(kind) or (kind,))
        if cli and isinstance(value, str) and number:
            # text from the command line that did not read as a number (see cli/params.py)
            raise InputError(f"{value}: expected {'a number' if float in number else 'a whole number'}")
        raise InputError(f"{where}: expected {_describe(kind)}", hint=hint)
    meta = field.metadata
    if meta.get("choices") and value not in meta["choices"]:
        raise InputError(f"{where}: choose from {', '.join(meta['choices'])}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where}: must be a finite number", hint=hint)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if meta.get("min") is not None and value < meta["min"]:
            raise InputError(f"{where}: must be at least {meta['min']:g}")
        if meta.get("max") is not None and value > meta["max"]:
            raise InputError(f"{where}: must be at most {meta['max']:g}")
    if meta.get("check") is not None and value is not None:
        try:
            meta["check"](value)
        except InputError as exc:
            flag = flag_of(field).split("/")[0]
            if not cli and ENTRY.get() != "cli" and exc.message.startswith(f"{flag} "):
                # "--resamples 50 is too few" -> "resamples=50 is too few" for a Python caller
                rest = exc.message[len(flag) + 1 :].split(" ", 1)
                raise InputError(
                    f"{field.name}={rest[0]} {rest[1] if len(rest) > 1 else ''}".rstrip(), hint=exc.hint
                ) from None
            raise
    return value


# torch.Generator.manual_seed and numpy's default_rng both take a seed in [0, 2**63): one range for both.
SEED_RANGE = (0, 2**63 - 1)


def check_seed(value: int) -> None:
    """A seed torch and numpy both accept, refused before any forward pass."""
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise InputError(f"seed {value}: a seed must be between {low} and 2**63 - 1")


def execute(
    analysis: Analysis,
    loaded: Any,
    options: Any,
    prepared: Any,
    progress: ProgressFactory | None,
    *,
    verify: bool = True,
) -> Outcome:
    """The one path every entry takes (``hs.run``, the CLI through it, and the sweep's workers):
    borrow the model, check the decompositions the run reports from on the model itself, run,
    record what was checked, then the causal check when the options ask for it (and ``verify``: a
    sweep stores tables only).

    A model whose attention maps do not reproduce it is refused here, the same way from every entry.
    Once the checks pass, what the command line held while loading and checking is shown
    (:func:`headscope.core.held.go_on`); a refusal drops it, so it stays one line.
    """
    from headscope.capture import checks
    from headscope.capture.borrow import borrowed

    analysis.check_loaded(loaded, options)
    with borrowed(loaded):
        checks.require(loaded, *analysis.views(loaded, options))
        held.go_on()
        outcome = analysis.run(loaded, options, prepared, progress)
        # Every decomposition checked on this model (the run's own, and any its parts asked for).
        outcome.extra_json["conformance"] = {
            view: found.to_json() for view, found in sorted(checks.checked(loaded).items())
        }
        if verify and analysis.wants_verify(options):
            outcome.checks = list(analysis.verify(loaded, outcome, options, progress))
    return outcome


def check_common(options: Any) -> None:
    """Every option of ``options`` through :func:`check_value` (type, range, choices, NaN and
    infinity, its own check): the one place options are checked, whatever built the dataclass (the
    API's keywords, the CLI's flags, a sweep's values, or a caller's own ``ScanOptions(...)``).
    Each analysis' ``check`` calls it first; what it checks after is what no single option shows."""
    kind = type(options)
    owner = next((a.name for a in ANALYSES.builtins().values() if a.options is kind), None)
    if owner is None:
        owner = next((a.name for a in ANALYSES.values() if a.options is kind), kind.__name__)
    hints = typing.get_type_hints(kind)
    for declared in dataclasses.fields(options):
        check_value(owner, declared, hints[declared.name], getattr(options, declared.name))


def _accept(obj: Any) -> Analysis:
    """An analysis (an ``Analysis`` subclass, instantiated here, or an instance), else TypeError."""
    from headscope.detectors.target import check_name

    found = obj() if isinstance(obj, type) and issubclass(obj, Analysis) else obj
    if not isinstance(found, Analysis):
        raise TypeError(f"{obj!r} is not an analysis: give a headscope.Analysis subclass")
    for attribute in ("name", "summary", "options"):
        if not hasattr(found, attribute):
            raise TypeError(f"analysis {type(found).__name__} declares no {attribute}")
    check_name(found.name, "analysis")
    if not dataclasses.is_dataclass(found.options):
        raise TypeError(f"analysis {found.name!r}: options must be a dataclass of option() fields")
    if type(found).run is Analysis.run:
        raise TypeError(f"analysis {found.name!r} does not implement run")
    return found


# Built-ins register with @register; plugins by entry point (group headscope.analyses); a notebook
# with hs.register. The API (hs.<name>), the CLI (headscope <name>) and the sweep read this.
ANALYSES: Registry[Analysis] = Registry(
    "analysis", "headscope.analyses", _accept, lambda a: a.name, builtins_from="headscope.analyses"
)


def register(cls: type[Analysis]) -> type[Analysis]:
    """Class decorator for the built-in analyses: one line puts an analysis behind the API, the CLI
    and the sweep. (A plugin declares an entry point instead; a notebook calls ``hs.register``.)"""
    ANALYSES.add_builtin(cls)
    return cls


def get(name: str) -> Analysis:
    """The registered analysis ``name`` (``headscope.analyses`` imports the modules that register them)."""
    if name not in ANALYSES:
        raise InputError(f"unknown analysis {name!r}", hint=f"choose from {', '.join(ANALYSES)}")
    return ANALYSES[name]


def split_names(value: str | Sequence[str] | None) -> list[str] | None:
    """'a,b' or ['a', 'b'] -> ['a', 'b']; None stays None."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items if str(item).strip()]
