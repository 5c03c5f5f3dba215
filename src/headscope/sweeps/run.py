"""The sweep driver: expand specs, skip what the store already holds, run the rest, write as results arrive."""

from __future__ import annotations

import errno
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headscope import files
from headscope.errors import InputError

from .executors import run_local, run_ray, sweepable
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


def parse_settings(chosen: Sequence[str], settings: Sequence[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` pairs: an option of the chosen analyses by its Python name, its value
    read as the option's type (``early=5``, ``text=held.txt``, ``fv=false``)."""
    import dataclasses
    import typing
    from pathlib import Path

    from headscope.analyses.protocol import get

    fields: dict[str, Any] = {}
    for name in chosen:
        kinds = typing.get_type_hints(get(name).options)
        for declared in dataclasses.fields(get(name).options):
            fields.setdefault(declared.name, kinds[declared.name])
    out: dict[str, Any] = {}
    for item in settings:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InputError(f"--set {item}: give NAME=VALUE, e.g. --set early=5")
        if key not in fields:
            raise InputError(
                f"--set {item}: {key} is an option of none of {', '.join(chosen)}",
                hint=f"known: {', '.join(sorted(fields))}",
            )
        kind = fields[key]
        members = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]
        value: Any = text
        if text.lower() == "none" and type(None) in typing.get_args(kind):
            value = None
        elif bool in members:
            if text.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                raise InputError(f"--set {item}: {key} takes true or false")
            value = text.lower() in {"true", "1", "yes"}
        elif int in members or float in members:
            try:
                value = int(text) if int in members else float(text)
            except ValueError:
                raise InputError(f"--set {item}: {key} takes a number") from None
        elif Path in members:
            value = Path(text)
        out[key] = value
    return out


def check_options(chosen: Sequence[str], options: dict[str, Any]) -> None:
    """Every option is checked, by the analyses that declare it, before any worker starts."""
    from headscope.analyses.protocol import get

    for name in chosen:
        analysis = get(name)
        analysis.check(analysis.take(options))
    unknown = sorted(set(options) - {o for name in chosen for o in get(name).option_names()})
    if unknown:
        raise InputError(f"sweep: options {', '.join(unknown)} belong to none of {', '.join(chosen)}")


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
    executor: str = "local",
    workers: int = 1,
    ray_address: str | None = None,
    cpus_per_run: float = 1.0,
    gpus_per_run: float = 0.0,
    retries: int = 2,
    force: bool = False,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> SweepResult:
    """Run every (target, analysis) the store does not already hold; return the whole store's result.

    Every option, the specs and the store (its folder, lock and manifest) are checked before the
    first run starts. Notes (a stale lock taken over, unknown manifest keys, a run computed again
    because its result file is missing or changed) go to ``on_note`` and ``SweepResult.notes``."""
    started = time.perf_counter()
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        if on_note is not None:
            on_note(text)

    chosen = check_analyses(analyses)
    check_options(chosen, options or {})
    if executor not in {"local", "ray"}:
        raise InputError(f"--executor must be local or ray, got {executor!r}")
    check_resources(workers=workers, retries=retries, cpus_per_run=cpus_per_run, gpus_per_run=gpus_per_run)
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise InputError(
                "--executor ray needs Ray, which is not installed", hint='pip install "headscope[ray]"'
            ) from None
    targets = expand(list(specs))
    options = dict(sorted((options or {}).items()))
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
                entry = {
                    "spec": target.spec,
                    "label": target.label,
                    "series": target.series,
                    "step": target.step,
                    "revision": target.revision,
                    "analysis": analysis,
                    "options": options,
                    "fingerprint": digest,
                }
                done, why = (False, "--force") if force else store.is_done(run_key, options, digest)
                if done:
                    result.skipped.append(run_key)
                    continue
                result.reasons[run_key] = why
                if why.startswith("result file") or why == "checksum mismatch":
                    shown = store.file_of(run_key).relative_to(folder)
                    note(f"run {run_key}: {why} ({shown}); computing it again")
                tasks.append(
                    {
                        "run_key": run_key,
                        "spec": target.spec,
                        "revision": target.revision,
                        "analysis": analysis,
                        "options": options,
                        "entry": entry,
                    }
                )
        if executor == "ray":
            stream = run_ray(tasks, ray_address, cpus_per_run, gpus_per_run, retries)
        else:
            stream = run_local(tasks, workers, retries)
        for task, outcome in stream:
            entry = dict(task["entry"], seconds=round(float(outcome.get("seconds", 0.0)), 3))
            if outcome["ok"]:
                store.record(task["run_key"], dict(entry, error=None), outcome["payload"])
                result.computed.append(task["run_key"])
            else:
                store.record(task["run_key"], dict(entry, status="failed", error=outcome["error"]), None)
                result.failed[task["run_key"]] = outcome["error"]
            if on_result is not None:
                on_result(task["run_key"], outcome)
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
