"""The detector table: every head role headscope knows, keyed by name, in one registry.

A new attention-pattern role is one declaration (a :class:`TargetDetector`, or a ``Detector``
subclass with its RoleSpec) added here, by a plugin's entry point (group ``headscope.detectors``),
or at run time by ``hs.register``; the scan, the role rule, the role map, the legends, the reports
and ``--verify`` read everything from :data:`DECLARATIONS`. Each declaration says the part it plays
(``Detector.part``): a scan's detector, a score an analysis computes itself, or an ``hs.detect``
pattern; :data:`REGISTRY`, :data:`SCORES` and :data:`PATTERNS` are the parts, read live from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.core.registry import RESERVED, Registry, View
from headscope.detectors.base import Detector, DetectorResult, RoleSpec
from headscope.detectors.circuits import IOIAttentionDetector, RetrievalDetector
from headscope.detectors.coref import CorefDetector
from headscope.detectors.functionvector import FunctionVectorScore
from headscope.detectors.induction import DuplicateTokenDetector, InductionDetector
from headscope.detectors.kvcache import LongRangeDetector
from headscope.detectors.positional import PreviousTokenDetector, SinkDetector
from headscope.detectors.syntax import SyntaxDetector
from headscope.detectors.target import PatternDetector, TargetDetector, Targets, check_name, check_source
from headscope.errors import InputError

# The scan's parts that run their own detectors on their own data (syntax(), coref(), ioi(), …).
BUILT_IN_PARTS = ("treebank", "coref", "ioi", "retrieval")
# A detector is declared either as a Detector subclass (the full contract: syntax, coreference) or
# as a declaration instance (TargetDetector, PatternDetector); calling either gives a fresh one to run.
Declaration = type[Detector] | Detector


def _accept(obj: Any) -> Declaration:
    """``obj`` if it declares a detector or a score, else TypeError saying what a declaration is.
    An ``hs.detect`` pattern is kept by :func:`keep_pattern`, never by a registration."""
    if isinstance(obj, type) and issubclass(obj, Detector):
        if getattr(obj, "__abstractmethods__", None):
            raise TypeError(
                f"detector class {obj.__name__} does not implement {', '.join(sorted(obj.__abstractmethods__))}"
            )
        for attribute in ("name", "summary"):
            if not isinstance(getattr(obj, attribute, None), str):
                raise TypeError(f"detector class {obj.__name__} declares no {attribute}")
        if obj.part not in ("scan", "score"):
            raise TypeError(f"detector class {obj.__name__}: part={obj.part!r}; a class is 'scan' or 'score'")
        check_name(obj.name)
        if obj.default_source not in BUILT_IN_PARTS:  # the scan's own parts read their own sets
            check_source(obj.default_source, obj.name)
            _check_own_set(obj.name, obj.default_source)
        return obj
    if isinstance(obj, PatternDetector):
        raise TypeError(
            f"{obj!r} holds one pattern per prompt of its own: run it with hs.detect, not in a scan"
        )
    if isinstance(obj, Detector) and callable(obj):
        _check_own_set(obj.name, obj.default_source)
        return obj
    raise TypeError(
        f"{obj!r} is not a detector: give a headscope.TargetDetector, or a headscope.Detector subclass"
    )


def _check_own_set(name: str, source: str) -> None:
    """A declaration scored on a prompt set of its own: the file is there when it is declared (the
    scan reads it later; a plugin whose file went missing is left out with its name, not the scan)."""
    if source in BUILT_IN_PARTS or source in ("text", "repeated-tokens"):
        return
    from pathlib import Path

    path = Path(source)
    if not path.is_file():
        what = "is a folder, not a prompt-set file" if path.is_dir() else "does not exist"
        raise InputError(
            f"detector {name!r}: its prompt set {source} {what}",
            hint="give source= the path of a .yaml, .jsonl or .txt prompt set that exists",
        )


def label_owner(
    label: str, registered: Mapping[str, Declaration] | None = None, *, pattern: str | None = None
) -> str | None:
    """Who already gives the role label ``label`` (a declaration of the table: a detector, a score,
    an ``hs.detect`` pattern other than ``pattern``; or a weight-only role), or None: a label names
    one role, and the role map and the legends look roles up by it."""
    from headscope.core import weighttables as weights_tables

    table = DECLARATIONS if registered is None else registered

    def holders(part: str, owner: str) -> list[tuple[str, list[RoleSpec]]]:
        return [
            (f"{owner} {name!r}", found.role_specs())
            for name, found in table.items()
            if found.part == part and not (part == "pattern" and name == pattern)
        ]

    owners = [
        *holders("scan", "detector"),
        *holders("score", "the score"),
        *[(f"the weight-only role {name!r}", [spec]) for name, spec in weights_tables.ROLES.items()],
        *holders("pattern", "the hs.detect pattern"),
    ]
    for owner, specs in owners:
        if any(label == taken.label for spec in specs for taken in spec.labels()):
            return owner
    return None


def reserved_detector_name(name: str) -> str | None:
    """Why ``name`` cannot name a scan's detector: the scan's word for its weight-only roles, a
    score's table, or an ``hs.detect`` pattern's (its tables would find the wrong role)."""
    if name == "weights":
        return "--detectors weights names the scan's weight-only roles, not a detector"
    found = DECLARATIONS.get(name)
    if found is not None and found.part == "score":
        return f"{name!r} names the tables of the {found.summary!r} score"
    if found is not None and found.part == "pattern":
        return f"{name!r} names an hs.detect pattern of this session"
    from headscope.core import weighttables as weights_tables

    if name in weights_tables.ROLES:
        return f"{name!r} names the scan's weight-only {name} table"
    return None


def _label_taken(new: Declaration, registered: dict[str, Declaration]) -> str | None:
    """A role label names one role: the role map and the legends look roles up by it. Checked
    against every declaration of the table (built-ins, plugins, run-time declarations, scores and
    hs.detect's patterns) and the weight-only roles."""
    for spec in new.role_specs():
        for label in spec.labels():
            owner = label_owner(label.label, registered)
            if owner is not None:
                return f"its role label {label.label!r} is the label of {owner}"
    return None


# The one detector table: every declaration, each with the part it plays (``Detector.part``). A
# scan runs the "scan" part; a score's tables ("score": kv-plan's long-range mass, icl's function
# vectors) and hs.detect's patterns ("pattern") are described like roles but never run in a scan.
# Names and role labels are unique over the whole table.
DECLARATIONS: Registry[Declaration] = Registry(
    "detector", "headscope.detectors", _accept, lambda d: d.name, _label_taken
)
RESERVED[DECLARATIONS.group] = lambda name: reserved_detector_name(name)
for _builtin in (
    PreviousTokenDetector,
    DuplicateTokenDetector,
    InductionDetector,
    SinkDetector,
    SyntaxDetector,
    CorefDetector,
    IOIAttentionDetector,
    RetrievalDetector,
    LongRangeDetector,
    FunctionVectorScore,
):
    DECLARATIONS.add_builtin(_builtin)

# The parts, read live from the table: what a scan can run (``--detectors``, ``hs.register``'s
# detectors, the plugins' group), the scores, and this session's hs.detect patterns.
REGISTRY: View[Declaration] = DECLARATIONS.view(lambda d: d.part == "scan")
SCORES: View[Declaration] = DECLARATIONS.view(lambda d: d.part == "score")
PATTERNS: View[Declaration] = DECLARATIONS.view(lambda d: d.part == "pattern")


def keep_pattern(detector: PatternDetector) -> None:
    """Keep ``hs.detect``'s pattern by name for this session (replacing an earlier hs.detect of that
    name), so that its tables' role, legend and summary are found as a detector's are; it belongs to
    the prompts its pattern was made for, so it never runs in a scan. ``hs.detect`` checks the name
    and the label before the model runs (:func:`reserved_detector_name`, :func:`label_owner`); they
    are checked again here, under the table's lock, for another thread's ``hs.detect`` that took
    the label since."""

    def label_still_free() -> None:
        for spec in detector.role_specs():
            for taken in spec.labels():
                owner = label_owner(taken.label, pattern=detector.name)
                if owner is not None:
                    raise InputError(
                        f"detect: label={taken.label!r} was taken by {owner} while this one ran "
                        "(another hs.detect at the same time)",
                        hint="give each pattern its own label=",
                    )

    DECLARATIONS.put(detector.name, detector, check=label_still_free)


def declared(name: str) -> Declaration | None:
    """The declaration behind a table's ``detector`` column (a detector's, a score's, a pattern's);
    None for a name nobody declared."""
    return DECLARATIONS.get(name)


def create(names: list[str] | None = None) -> list[Detector]:
    """Instantiate detectors by name (every registered one when ``names`` is None). A pattern
    detector (``hs.detect``) holds one pattern per prompt of its own, so it never runs in a scan."""
    chosen = list(REGISTRY) if names is None else names
    own = [n for n in chosen if n in PATTERNS]
    unknown = [n for n in chosen if n not in REGISTRY and n not in own]
    if unknown:
        raise InputError(f"unknown detector {', '.join(unknown)}", hint=f"choose from {', '.join(REGISTRY)}")
    if own:
        raise InputError(
            f"detector {', '.join(own)} scores the prompts its pattern was made for (hs.detect), not a scan's data",
            hint="run hs.detect again, or declare a TargetDetector to scan",
        )
    return [_guarded(n, REGISTRY[n]()) for n in chosen]


# The methods a full-contract detector writes itself (a Detector subclass); a declared one's
# (TargetDetector) own code is its targets function, which names itself when it raises.
_OWN_CODE = ("start", "reads", "update", "update_pairs", "end_layer", "results")


def _guarded(name: str, detector: Detector) -> Detector:
    """A Detector subclass from a plugin or a notebook, whose methods raise a RunFailure naming the
    detector and its origin instead of an unexpected error of the scan; a built-in as it is."""
    origin = REGISTRY.origin(name)
    if origin == "built-in" or not isinstance(REGISTRY[name], type):
        return detector
    for method in _OWN_CODE:
        setattr(detector, method, _named(getattr(detector, method), name, origin, method))
    return detector


def _named(method: Any, name: str, origin: str, what: str) -> Any:
    import functools

    from headscope.errors import HeadscopeError, RunFailure

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except HeadscopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - the detector's own code: say whose it is
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise RunFailure(
                f"detector {name!r} ({origin}): its {what}() raised {type(exc).__name__}: {first}",
                hint="a bug in the detector; leave it out with --detectors (detectors= in Python) until it is fixed",
            ) from exc

    return call


__all__ = [
    "DECLARATIONS",
    "REGISTRY",
    "SCORES",
    "Declaration",
    "PATTERNS",
    "declared",
    "keep_pattern",
    "label_owner",
    "Detector",
    "DetectorResult",
    "PatternDetector",
    "RoleSpec",
    "TargetDetector",
    "Targets",
    "create",
]
