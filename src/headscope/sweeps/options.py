"""A sweep's own options, declared once: ``hs.sweep``'s keywords, :func:`headscope.sweeps.run.sweep`'s,
and ``headscope sweep``'s flags (their help texts, defaults and checks) are these fields.

The analyses' options a sweep passes on are theirs (:func:`headscope.sweeps.executors.swept_options`
gives the common ones a flag); these are the store, where the runs go, and whether to recompute.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from headscope.extend.protocol import option


@dataclass(kw_only=True)
class Store:
    """Where the sweep's results go, and which analyses it runs."""

    out: Path = option(MISSING, "The store: result files, manifest.json, sweep.csv.", flag="--out")
    analyses: str | list[str] = option(
        "induction", "Comma-separated analyses (see store_group).", flag="--analysis", cli_type=str
    )


def _resource(default: Any, help: str) -> Any:
    """An option the sweep checks itself, in its own words (:func:`headscope.sweeps.run.check_resources`)."""
    return dataclasses.field(default=default, metadata={"help": help, "checked_by_api": True})


@dataclass(kw_only=True)
class Resources:
    """Where the runs go."""

    executor: str = option("local", "local worker processes, or Ray.", choices=("local", "ray"))
    workers: int = _resource(1, "Local worker processes.")
    ray_address: str | None = _resource(
        None, "auto or ray://HOST:PORT (default: start a local Ray for this sweep)."
    )
    cpus_per_run: float = _resource(1.0, "Ray: CPUs per run.")
    gpus_per_run: float = _resource(0.0, "Ray: GPUs per run.")
    retries: int = _resource(2, "Retries of a run whose worker died.")


@dataclass(kw_only=True)
class Recompute:
    force: bool = option(False, "Recompute every run, valid or not.")


@dataclass(kw_only=True)
class Settings:
    """Any option of the chosen analyses, as text (:func:`headscope.sweeps.run.parse_settings`)."""

    settings: list[str] | None = option(
        None,
        "Any other option of the chosen analyses, NAME=VALUE by its Python name (icl: --set early=5 "
        "--set text=held.txt; ANALYSIS.NAME where two analyses mean different things by NAME: --set "
        "icl.k=7). Repeat it for several.",
        flag="--set",
    )


def store_group() -> type:
    """:class:`Store` with ``--analysis``'s help listing the analyses a sweep can run now (the
    registry read here, plugins included: not while headscope is being imported)."""
    from .executors import sweepable

    names = ", ".join(["induction (default)", *(a for a in sweepable() if a != "induction")])
    return retold(Store, analyses=f"Comma-separated: {names}.")


def retold(group: type, **helps: str) -> type:
    """A copy of the option group ``group`` whose fields named in ``helps`` have that help text."""
    kinds = typing.get_type_hints(group)
    fields = []
    for f in dataclasses.fields(group):
        meta = dict(f.metadata, help=helps[f.name]) if f.name in helps else f.metadata
        fields.append((f.name, kinds[f.name], dataclasses.field(default=f.default, metadata=meta)))
    return dataclasses.make_dataclass(group.__name__, fields, kw_only=True)


def fields_of(*groups: type) -> list[dataclasses.Field]:
    return [f for group in groups for f in dataclasses.fields(group)]
