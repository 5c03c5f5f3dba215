"""Running sweep tasks: one task loads one model, runs one analysis and returns its result.

* ``local``: N worker processes (spawned, so each starts clean); each loads one model at a time.
  A worker that dies is replaced and its task retried up to ``retries`` times.
* ``ray``: each task is a Ray task with ``num_cpus``, ``num_gpus`` and ``max_retries``; Ray
  schedules them, and retries a task whose worker died. Nothing of ours schedules work.

In both, workers only compute: the driver writes the store as results come back, so a worker
that dies leaves no partial file.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from headscope.errors import HeadscopeError, InputError

Task = dict[str, Any]
Outcome = dict[str, Any]  # {"ok": bool, "payload" | "error", "seconds"}


def sweepable() -> list[str]:
    """The analyses a sweep runs: those that declare ``sweepable`` (one tidy table per model, from
    short prompts), built-in or plugin."""
    from headscope.analyses import ANALYSES

    return [name for name, analysis in ANALYSES.items() if analysis.sweepable]


# The options of the sweepable analyses that a sweep gives a flag of its own (``headscope sweep
# --seq-len``), each as its analysis declares it; "ANALYSIS.NAME" for one analysis' option that another
# means differently. Any other option is passed by name (``--set NAME=VALUE``, ``hs.sweep(NAME=...)``).
SWEPT = ("seq_len", "repeat_seq", "n_seqs", "weights.tokens", "weights.k", "resamples", "seed")


def swept_options() -> type:
    """:data:`SWEPT` as one option group: each field its analysis' (type, help, default, range;
    the help says whose where a name is one analysis'), named by the option's own name."""
    import dataclasses
    import typing

    from headscope.analyses import get

    fields = []
    for key in SWEPT:
        owner, _, name = key.rpartition(".")
        analysis = get(owner or next(a for a in sweepable() if name in get(a).option_names()))
        declared = next(f for f in dataclasses.fields(analysis.options) if f.name == name)
        kind = typing.get_type_hints(analysis.options)[name]
        help = f"{owner}: {declared.metadata['help']}" if owner else declared.metadata["help"]
        meta = dict(declared.metadata, help=help)
        fields.append((name, kind, dataclasses.field(default=declared.default, metadata=meta)))
    return dataclasses.make_dataclass("Swept", fields, kw_only=True)


def swept_given(group: type, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The values ``given`` to fields of :func:`swept_options`' ``group``, by the key a sweep routes
    them with (``k`` -> ``weights.k``), and each as the command line said it (``--batch 300``)."""
    import dataclasses

    from headscope.extend.protocol import flag_of

    keys = {key.rpartition(".")[2]: key for key in SWEPT}
    flags = {f.name: flag_of(f).split("/")[0] for f in dataclasses.fields(group)}
    values = {keys[name]: value for name, value in given.items()}
    said = {keys[name]: f"{flags[name]} {value}" for name, value in given.items()}
    return values, said


def run_task(task: Task) -> Outcome:
    """Load the task's model and run its analysis. Never raises for a bad model: says why."""
    started = time.perf_counter()
    threads = task.get("threads")
    try:
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        payload = _analyse(task)
    except HeadscopeError as exc:
        return {"ok": False, "error": str(exc).splitlines()[0], "seconds": time.perf_counter() - started}
    except Exception as exc:  # noqa: BLE001 - a run that fails is recorded, the sweep goes on
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return {"ok": False, "error": text, "seconds": time.perf_counter() - started}
    return {"ok": True, "payload": payload, "seconds": time.perf_counter() - started}


def _analyse(task: Task) -> dict[str, Any]:
    """One run: the analysis from the registry, with the options the sweep gave it."""
    from headscope.analyses import get
    from headscope.extend.protocol import execute
    from headscope.models import load
    from headscope.verdicts.results import CSV_COLUMNS

    analysis = get(task["analysis"])
    # The options the driver routed to this analysis (sweeps.run.plan); the rest are its defaults.
    options = analysis.make_options(task["values"])
    prepared_input = analysis.check(options)
    loaded = load(task["spec"], revision=task.get("revision"))
    # The one path (extend.protocol.execute): the same conformance checks and refusals as hs.run
    # and the CLI; a sweep stores tables, so the causal check is off (as it always was here).
    outcome = execute(analysis, loaded, options, prepared_input, None, verify=False)
    report = outcome.report
    table = report.table[CSV_COLUMNS]
    rows = [
        {key: (None if isinstance(value, float) and value != value else value) for key, value in row.items()}
        for row in table.to_dict(orient="records")
    ]
    loss = None
    if report.loss is not None:
        loss = {"per_copy": report.loss.per_copy, "first": report.loss.first, "later": report.loss.later}
    return {
        "rows": rows,
        "loss": loss,
        "measures": dict(report.measures) or None,
        "notes": list(report.notes),
        "layers": loaded.layout.n_layers,
        "heads": loaded.layout.n_heads,
        # The analysis' own records (describe's atlas, icl's score, ...), as its result JSON holds
        # them: a stored run reads back with them, so compare sees two runs' descriptions.
        "document": _own_records(analysis, outcome),
    }


def _own_records(analysis: Any, outcome: Any) -> dict[str, Any]:
    """``analysis.json(outcome)`` as plain JSON (numpy values as numbers, NaN as null), as the
    result JSON writes it."""
    import math

    import numpy as np

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, np.ndarray):
            return plain(value.tolist())
        if isinstance(value, np.generic):
            return plain(value.item())
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    return {k: plain(v) for k, v in analysis.json(outcome).items() if v is not None}


def _quiet_worker() -> None:
    """A worker ignores Ctrl-C: the driver stops it (a terminal's Ctrl-C reaches the whole process
    group, and a worker importing torch would print its traceback)."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker is terminated when the sweep is interrupted: a process-shared lock that tqdm would
    # make for its bars (weights loading) would then be reported as leaked at exit. Threads suffice.
    with contextlib.suppress(ImportError):
        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while worker processes start: they inherit it from their first instruction
    (before Python's own handler, or any import, could turn it into a traceback). The main thread
    only: elsewhere signals cannot be set, and Ctrl-C is the main thread's anyway."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(pool: Any) -> None:
    """End a pool now: queued tasks cancelled, running workers terminated (they ignore Ctrl-C)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()
    for process in processes:
        with contextlib.suppress(Exception):
            process.join(5)
    # With its workers gone the pool's manager thread ends at once; waiting for it frees the pool's
    # queues (else the resource tracker warns of a leaked semaphore at exit).
    pool.shutdown(wait=True, cancel_futures=True)


def worker_threads(workers: int) -> int:
    """Torch threads for each of ``workers`` local worker processes: the CPUs split between them,
    and no more than an explicit ``OMP_NUM_THREADS`` (the thread budget the user gave this process,
    which its workers inherit). Two threads on a core another process keeps busy wait on each other:
    beside one busy core, a toy run took 9-11 s with two threads and 5.3 s with one (2026-12-05)."""
    cpus = os.cpu_count() or 1
    threads = max(1, cpus // max(1, workers))
    budget = os.environ.get("OMP_NUM_THREADS", "").strip()
    if budget.isascii() and budget.isdigit() and int(budget) > 0:
        threads = min(threads, int(budget))
    return threads


def run_local(tasks: list[Task], workers: int, retries: int) -> Iterator[tuple[Task, Outcome]]:
    """Yield (task, outcome) as N spawned worker processes finish them. Closing the iterator early
    (Ctrl-C in the driver) stops the workers at once."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    threads = worker_threads(workers)
    pending = [dict(task, threads=threads) for task in tasks]
    attempts: dict[str, int] = {}
    context = multiprocessing.get_context("spawn")
    while pending:
        pool = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=context, initializer=_quiet_worker)
        finished = False
        try:
            with _sigint_ignored():  # the pool starts its processes on the first submit
                futures = {pool.submit(run_task, task): task for task in pending}
            pending = []
            while futures:
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    task = futures.pop(future)
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        key = task["run_key"]
                        attempts[key] = attempts.get(key, 0) + 1
                        if attempts[key] <= retries:
                            pending.append(task)
                        else:
                            yield task, {"ok": False, "error": "the worker process died", "seconds": 0.0}
                        continue
                    yield task, outcome
                if pending:  # the pool is broken: start a new one for what is left
                    pending += list(futures.values())
                    break
            finished = True
        finally:
            if finished:
                pool.shutdown(wait=True)
            else:
                _stop(pool)


def run_ray(
    tasks: list[Task],
    address: str | None,
    cpus_per_run: float,
    gpus_per_run: float,
    retries: int,
) -> Iterator[tuple[Task, Outcome]]:
    """Yield (task, outcome) as Ray finishes them. Uses a running Ray (``address``, or one this
    process already started), else starts a local one and stops it afterwards."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "--executor ray needs Ray, which is not installed",
            hint='pip install "headscope[ray]"',
        ) from None
    started_here = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        remote = ray.remote(num_cpus=cpus_per_run, num_gpus=gpus_per_run, max_retries=retries)(run_task)
        threads = max(1, int(cpus_per_run))
        refs = {remote.remote(dict(task, threads=threads)): task for task in tasks}
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                task = refs.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - worker died past its retries
                    outcome = {
                        "ok": False,
                        "error": f"ray: {type(exc).__name__}".splitlines()[0],
                        "seconds": 0.0,
                    }
                yield task, outcome
    finally:
        if started_here:
            ray.shutdown()
