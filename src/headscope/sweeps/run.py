"""The sweep driver: expand specs, skip what the store already holds, run the rest, write as results arrive."""

from __future__ import annotations

import errno
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headscope import files
from headscope.errors import InputError

from .executors import run_local, run_ray, sweepable
from .options import Resources
from .specs import Target, expand, fingerprint
from .store import Store, locked


@dataclass
class SweepResult:
    folder: Path
    targets: list[Target]
    analyses: list[str]
    computed: list[str] = field(default_factory=list)  # run keys computed by this invocation
    skipped: list[str] = field(default_factory=list)  # valid runs found in the store
    failed: dict[str, str] = field(default_factory=dict)  # run key -> one-line reason
    reasons: dict[str, str] = field(default_factory=dict)  # why a run was (re)computed
    seconds: float = 0.0
    table: pd.DataFrame | None = None  # sweep.csv
    losses: pd.DataFrame | None = None  # repeated-copy loss per run (induction)
    notes: list[str] = field(default_factory=list)  # what the user should hear (stale lock taken over, …)

    def emergence(self) -> pd.DataFrame:
        """Per role table: best score first and last step, where it rose most, first step per head."""
        from .summary import emergence

        return emergence(self.table, self.losses) if self.table is not None else pd.DataFrame()

    def across_models(self) -> pd.DataFrame:
        """Heads per role and their mean relative depth, at the last step of each series."""
        from .summary import across_models

        return across_models(self.table) if self.table is not None else pd.DataFrame()


def check_analyses(names: Sequence[str]) -> list[str]:
    chosen = [n.strip() for n in names if n.strip()]
    known = sweepable()
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        raise InputError(
            f"--analysis {','.join(unknown) or '(none)'}: unknown analysis",
            hint=f"choose from {', '.join(known)}",
        )
    return list(dict.fromkeys(chosen))


# A sweep stores each analysis' tables and never runs its causal check (no ablation): the options that
# only the check reads would change nothing, and are refused. Per analysis, beyond these names:
CAUSAL_ONLY = frozenset({"verify", "verify_k", "ablate", "ablation"})
CAUSAL_ONLY_OF = {"induction": frozenset({"draws"}), "weights": frozenset({"draws"})}


def unused_in_sweep(analysis: Any) -> set[str]:
    """The options of ``analysis`` a sweep never reads (its causal check's); an analysis may declare
    them itself as ``sweep_unused``."""
    declared = getattr(analysis, "sweep_unused", None)
    if declared is not None:
        return set(declared) & analysis.option_names()
    return set(CAUSAL_ONLY | CAUSAL_ONLY_OF.get(analysis.name, frozenset())) & analysis.option_names()


def _help(analysis: Any, name: str) -> str:
    import dataclasses

    return next(f.metadata.get("help", "") for f in dataclasses.fields(analysis.options) if f.name == name)


def route(chosen: Sequence[str], key: str, said: str) -> tuple[list[str], str]:
    """The analyses an option goes to, and its name: ``name`` goes to every chosen analysis that
    declares it (and reads it in a sweep), ``analysis.name`` to that one. Refused (InputError naming
    ``said``, the option as the caller wrote it): a name no chosen analysis declares, one only a
    causal check reads, and one that means different things in two of them (say which)."""
    from headscope.analyses import get

    owner, dot, name = key.strip().rpartition(".")
    name = name.strip().replace("-", "_")
    known = sorted({o for a in chosen for o in get(a).option_names() - unused_in_sweep(get(a))})
    if dot:
        if owner not in chosen:
            raise InputError(
                f"{said}: {owner} is not one of this sweep's analyses ({', '.join(chosen)})",
                hint="name one of them before the dot, or add it to the analyses",
            )
        targets = [owner]
        if name not in get(owner).option_names():
            raise InputError(
                f"{said}: {owner} has no option {name}",
                hint=f"known: {', '.join(sorted(get(owner).option_names() - unused_in_sweep(get(owner))))}",
            )
    else:
        targets = [a for a in chosen if name in get(a).option_names()]
        if not targets:
            raise InputError(
                f"{said}: {name} is an option of none of {', '.join(chosen)}",
                hint=f"known: {', '.join(known)}",
            )
    users = [a for a in targets if name not in unused_in_sweep(get(a))]
    if not users:
        raise InputError(
            f"{said}: a sweep stores the tables of {', '.join(targets)} and never runs the causal check "
            f"(ablation), so {name} would change nothing",
            hint=f"drop it, and run headscope {targets[0]} on one model for the check",
        )
    if len(users) > 1 and len({_help(get(a), name) for a in users}) > 1:
        raise InputError(
            f"{said}: {name} means different things in {' and '.join(users)}",
            hint=f"say which: {users[0]}.{name}=…",
        )
    return users, name


def parse_settings(
    chosen: Sequence[str], settings: Sequence[str], taken: dict[str, str] | None = None
) -> dict[str, Any]:
    """``--set NAME=VALUE`` pairs: an option of the chosen analyses by its Python name (or
    ``ANALYSIS.NAME`` where two of them declare it with different meanings), its value read as the
    option's type (``early=5``, ``text=held.txt``, ``fv=false``, ``tasks=a.yaml,b.yaml``). A name
    given twice (or also given by a flag in ``taken``: name -> flag) is refused."""
    import typing

    from headscope.analyses import get
    from headscope.extend.protocol import split_names

    out: dict[str, Any] = {}
    said: dict[tuple[str, str], str] = {}
    for key, flag in (taken or {}).items():
        users, name = route(chosen, key, flag)
        said.update({(owner, name): flag for owner in users})
    for item in settings:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--set {item}: give NAME=VALUE, e.g. --set early=5")
        if not text.strip():
            raise InputError(f"--set {item}: give {key} a value (none for its default, where it has one)")
        users, name = route(chosen, key, f"--set {item}")
        for owner in users:
            if (owner, name) in said:
                raise InputError(
                    f"--set {item}: {name} is already set ({said[(owner, name)]})",
                    hint="give each option once",
                )
            said[(owner, name)] = f"--set {item}"
        kind = typing.get_type_hints(get(users[0]).options)[name]
        members = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]
        value: Any = text
        if text.lower() == "none" and type(None) in typing.get_args(kind):
            value = None
        elif bool in members:
            if text.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                raise InputError(f"--set {item}: {name} takes true or false")
            value = text.lower() in {"true", "1", "yes"}
        elif int in members or float in members:
            try:
                value = int(text) if int in members else float(text)
            except ValueError:
                number = "a whole number" if int in members and float not in members else "a number"
                raise InputError(f"--set {item}: {name} takes {number}") from None
        elif str not in members and any(typing.get_origin(k) is list for k in members):
            value = split_names(text)
        for user in users:
            _check_setting(user, name, value, item, text)
        owner = key.rpartition(".")[0].strip()
        out[f"{owner}.{name}" if owner else name] = value
    return out


def _check_setting(analysis_name: str, name: str, value: Any, item: str, text: str) -> None:
    """``--set NAME=VALUE`` checked as the analysis checks the option, and refused in the words the
    user typed (``--set early=0: must be at least 1``), not a Python call's (``icl: early=0``)."""
    import dataclasses
    import typing

    from headscope.analyses import get
    from headscope.extend.protocol import check_value, flag_of

    options = get(analysis_name).options
    declared = next(f for f in dataclasses.fields(options) if f.name == name)
    try:
        check_value(analysis_name, declared, typing.get_type_hints(options)[name], value, cli=True)
    except InputError as exc:
        flag = flag_of(declared).split("/")[0]
        reason = exc.message
        prefixes = (
            f"{flag} {text}: ",
            f"{flag} {text} ",
            f"{flag} {text!r} ",
            f"{flag}: ",
            f"{name} {text}: ",
        )
        for prefix in (*prefixes, f"{text}: "):
            if reason.startswith(prefix):
                reason = reason[len(prefix) :].removeprefix("is ")
                break
        raise InputError(f"--set {item}: {reason}", hint=exc.hint) from None


@dataclass(frozen=True)
class Planned:
    """One analysis of a sweep: what its workers get, and what its manifest entries record."""

    values: dict[str, Any]  # the options given to it (the rest are its defaults)
    record: dict[str, Any]  # every option the run reads, as JSON: a change means a rerun
    inputs: dict[str, str]  # option -> digest of the data file(s) it names: a change means a rerun


def plan(chosen: Sequence[str], options: dict[str, Any]) -> dict[str, Planned]:
    """Every option routed (:func:`route`) and checked by the analyses that declare it (type, range,
    data files read), before any worker starts; what each analysis' runs record in the manifest."""
    import dataclasses

    from headscope.analyses import get

    values: dict[str, dict[str, Any]] = {name: {} for name in chosen}
    given: dict[tuple[str, str], str] = {}
    for key, value in options.items():
        users, name = route(chosen, key, f"{key}={value!r}")
        for owner in users:
            if (owner, name) in given:
                raise InputError(
                    f"{key}={value!r}: {given[(owner, name)]} already sets {name} of {owner}",
                    hint="give each option once",
                )
            given[(owner, name)] = key
            values[owner][name] = value
    planned = {}
    for name in chosen:
        analysis = get(name)
        made = analysis.make_options(values[name])
        analysis.check(made)
        unused = unused_in_sweep(analysis)
        record = {
            f.name: _as_json(name, f.name, getattr(made, f.name))
            for f in dataclasses.fields(made)
            if f.name not in unused
        }
        inputs = {key: digest for key, value in record.items() if (digest := _data_digest(value))}
        planned[name] = Planned(values[name], record, inputs)
    return planned


def _as_json(analysis: str, name: str, value: Any) -> Any:
    """An option's value as the manifest holds it (paths as strings); InputError when it has no
    JSON form (a sweep records every option it ran with)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, list | tuple):
        return [_as_json(analysis, name, item) for item in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _as_json(analysis, name, v) for k, v in value.items()}
    raise InputError(
        f"{analysis}: {name}={value!r} cannot be recorded in the sweep's manifest",
        hint="give a string, a number, true/false, a path or a list of them",
    )


def _data_digest(value: Any) -> str | None:
    """The SHA-256 of the file(s) an option's value names, if it names any (a data file whose
    contents change makes the run's stored numbers stale)."""
    import hashlib

    names = value if isinstance(value, list) else [value]
    digest = hashlib.sha256()
    found = False
    for item in names:
        if not isinstance(item, str) or not item or "\0" in item:
            continue
        path = Path(item).expanduser()
        try:
            if path.is_file():
                digest.update(f"{item}:".encode() + hashlib.sha256(path.read_bytes()).digest())
                found = True
            elif path.is_dir():
                for file in sorted(p for p in path.rglob("*") if p.is_file()):
                    digest.update(f"{file.relative_to(path)}:".encode())
                    digest.update(hashlib.sha256(file.read_bytes()).digest())
                found = True
        except OSError as exc:
            raise InputError(f"{item}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    return "sha256:" + digest.hexdigest() if found else None


# Resource options: (lowest allowed, whether the lowest itself is allowed, highest); checked, never clipped.
LIMITS: dict[str, tuple[float, bool, float]] = {
    "--workers": (1, True, 1024),
    "--retries": (0, True, 100),
    "--cpus-per-run": (0, False, 4096),
    "--gpus-per-run": (0, True, 1024),
}


def check_resources(**values: float) -> None:
    """``--workers``, ``--retries``, ``--cpus-per-run``, ``--gpus-per-run`` (as keyword names with
    underscores) in range; InputError naming the option and the range otherwise."""
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        low, inclusive, high = LIMITS[flag]
        integer = flag in ("--workers", "--retries")
        kind = "a whole number" if integer else "a number"
        low_text = f"{'from' if inclusive else 'above'} {low:g}"
        wrong_type = isinstance(value, bool) or not isinstance(value, (int, float))
        if wrong_type or (integer and not float(value).is_integer()) or not math.isfinite(value):
            raise InputError(f"{flag} must be {kind} {low_text} to {high:g}, got {value!r}")
        if value < low or (value == low and not inclusive) or value > high:
            raise InputError(f"{flag} must be {kind} {low_text} to {high:g}, got {value:g}")


def prepare_folder(out: str | Path) -> Path:
    """The store's folder, created; InputError naming --out and the cause when it cannot be."""
    folder = Path(out).expanduser()
    try:
        if folder.exists() and not folder.is_dir():
            raise InputError(f"--out {out}: is a file", hint="give a folder")
        for parent in folder.parents:
            if parent.exists() and not parent.is_dir():
                raise InputError(f"--out {out}: {parent} is a file, not a folder", hint="give another --out")
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise InputError(
                f"--out {out}: name too long for the file system", hint="choose a shorter name"
            ) from None
        raise InputError(
            f"--out {out}: cannot create the store folder ({exc.strerror or type(exc).__name__})",
            hint="give a folder you can write to",
        ) from None
    return folder


def sweep(
    specs: Sequence[str],
    out: str | Path,
    *,
    analyses: Sequence[str] = ("induction",),
    options: dict[str, Any] | None = None,
    force: bool = False,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    **resources: Any,
) -> SweepResult:
    """Run every (target, analysis) the store does not already hold; return the whole store's result.

    ``resources`` are the fields of :class:`headscope.sweeps.options.Resources` (``executor``,
    ``workers``, ``ray_address``, ``cpus_per_run``, ``gpus_per_run``, ``retries``). Every option, the
    specs and the store (its folder, lock and manifest) are checked before the first run starts.
    Notes (a stale lock taken over, unknown manifest keys, a run computed again because its result
    file is missing or changed) go to ``on_note`` and ``SweepResult.notes``."""
    started = time.perf_counter()
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if on_note is not None:
            on_note(text)

    chosen = check_analyses(analyses)
    planned = plan(chosen, options or {})
    where = Resources(**resources)
    if where.executor not in {"local", "ray"}:
        raise InputError(f"--executor must be local or ray, got {where.executor!r}")
    check_resources(
        workers=where.workers,
        retries=where.retries,
        cpus_per_run=where.cpus_per_run,
        gpus_per_run=where.gpus_per_run,
    )
    if where.executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise InputError(
                "--executor ray needs Ray, which is not installed", hint='pip install "headscope[ray]"'
            ) from None
    targets = expand(list(specs))
    folder = prepare_folder(out)
    result = SweepResult(folder, targets, chosen, notes=notes)
    with locked(folder, note):
        store = Store(folder)
        store.open()
        for text in store.notes:
            note(text)
        tasks = []
        for target in targets:
            try:
                digest = fingerprint(target)
            except Exception as exc:  # noqa: BLE001 - an unloadable spec is a failed run, not a crash
                digest = f"unreadable: {type(exc).__name__}"
            for analysis in chosen:
                run_key = f"{target.key}__{analysis}"
                run = planned[analysis]
                entry = {
                    "spec": target.spec,
                    "label": target.label,
                    "series": target.series,
                    "step": target.step,
                    "revision": target.revision,
                    "analysis": analysis,
                    "options": run.record,
                    "inputs": run.inputs,
                    "fingerprint": digest,
                }
                if force:
                    done, why = False, "--force"
                else:
                    done, why = store.is_done(run_key, run.record, digest, run.inputs)
                if done:
                    result.skipped.append(run_key)
                    continue
                result.reasons[run_key] = why
                if why.startswith("result file") or why == "checksum mismatch":
                    shown = store.file_of(run_key).relative_to(folder)
                    note(f"run {run_key}: {why} ({shown}); computing it again")
                elif why in CHANGED:
                    note(f"run {run_key}: {CHANGED[why]} since it was stored; computing it again")
                tasks.append(
                    {
                        "run_key": run_key,
                        "spec": target.spec,
                        "revision": target.revision,
                        "analysis": analysis,
                        "values": run.values,
                        "entry": entry,
                    }
                )
        if where.executor == "ray":
            stream = run_ray(tasks, where.ray_address, where.cpus_per_run, where.gpus_per_run, where.retries)
        else:
            stream = run_local(tasks, where.workers, where.retries)
        try:
            for task, outcome in stream:
                entry = dict(task["entry"], seconds=round(float(outcome.get("seconds", 0.0)), 3))
                if outcome["ok"]:
                    try:
                        store.record(task["run_key"], dict(entry, error=None), outcome["payload"])
                    except (TypeError, ValueError) as exc:  # nothing was written (Store.record)
                        why = f"its result cannot be stored as JSON ({type(exc).__name__}: {exc})"
                        outcome = {**outcome, "ok": False, "error": why.splitlines()[0][:300]}
                    else:
                        result.computed.append(task["run_key"])
                if not outcome["ok"]:
                    store.record(task["run_key"], dict(entry, status="failed", error=outcome["error"]), None)
                    result.failed[task["run_key"]] = outcome["error"]
                if on_result is not None:
                    on_result(task["run_key"], outcome)
        except KeyboardInterrupt:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # the executor stops its workers (run_local's finally)
            left = len(tasks) - len(result.computed) - len(result.failed)
            raise SweepInterrupted(folder, len(result.computed), len(result.skipped), left) from None
        from .summary import collect

        result.table, result.losses = collect(store, targets, chosen)
        if result.table is not None:
            files.write_atomic(
                folder / "sweep.csv",
                result.table.to_csv(index=False, float_format="%.6g", lineterminator="\n"),
                "--out",
                True,
            )
    result.seconds = time.perf_counter() - started
    return result


# is_done's reason -> what a note says changed (a run stored before, computed again)
CHANGED = {
    "options changed": "its options changed",
    "weights changed": "the model's weights (or its adapter's base) changed",
    "data changed": "a data file its options name changed",
}


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: the runs finished so far are in the store; the same sweep again
    computes the rest. ``str()`` is the one line to print."""

    def __init__(self, folder: Path, computed: int, skipped: int, left: int) -> None:
        super().__init__(folder, computed, skipped, left)
        self.folder, self.computed, self.skipped, self.left = folder, computed, skipped, left

    def __str__(self) -> str:
        kept = self.computed + self.skipped
        return (
            f"interrupted: {kept} finished run{'s' if kept != 1 else ''} kept in the store {self.folder} "
            f"({self.computed} computed now), {self.left} not run; run the same sweep again to compute "
            "the rest"
        )
