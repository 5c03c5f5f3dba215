"""How a model spec is loaded, declared once: ``hs.load``, ``hs.run`` and the analyses' functions, the
CLI's load options (``--device``, ``--dtype``, ``--capture``, ``--device-map``) and the sweep read
these fields: their names, help texts, defaults, choices and checks.

A field's metadata has the keys the CLI reads from every option (``help``, ``choices``, ``flag``;
see :func:`headscope.extend.protocol.option`), and ``spec_default``: the value a spec loads with
where the caller gave none. ``None`` in the API means "not given", so that a model object, which is
used where and as it is, can refuse a device or dtype it was given.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from headscope.errors import InputError

DeviceName = Literal["auto", "cpu", "cuda", "mps"]
DtypeName = Literal["float32", "bfloat16", "float16"]
CaptureName = Literal["auto", "stream", "eager"]

DEVICES: tuple[str, ...] = typing.get_args(DeviceName)
DTYPES: tuple[str, ...] = typing.get_args(DtypeName)
CAPTURES: tuple[str, ...] = typing.get_args(CaptureName)


def _field(default: Any, help: str, *, choices: tuple[str, ...] | None = None, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, **meta})


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """How a spec is loaded (all None or "auto": the defaults, ``spec_default`` of each field)."""

    device: str | None = _field(None, "Where to run the model.", choices=DEVICES, spec_default="cpu")
    dtype: str | None = _field(
        None, "Model weights dtype (scores are float32).", choices=DTYPES, spec_default="float32"
    )
    capture: str = _field(
        "auto", "stream: per-layer hand-off (default); eager: output_attentions.", choices=CAPTURES
    )
    device_map: str | None = _field(None, "'auto': let accelerate spread a model too big for one device.")
    revision: str | None = _field(
        None, "A revision (branch, tag or commit) of a hub model already in the local cache.", cli=False
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            choices = f.metadata["choices"]
            if choices and value is not None and value not in choices:
                raise InputError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def given(self) -> list[str]:
        """The options set to other than their defaults (a model object takes none of them)."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]

    @classmethod
    def from_groups(cls, *groups: Any) -> LoadOptions:
        """The load options among the fields of ``groups`` (option groups of :func:`load_group`)."""
        return cls(**{n: getattr(g, n) for g in groups for n in cls.names() if hasattr(g, n)})

    def for_spec(self) -> dict[str, Any]:
        """Keyword arguments of :func:`headscope.models.load`: each unset option at its spec default."""
        return {
            f.name: f.metadata.get("spec_default", f.default)
            if getattr(self, f.name) is None
            else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }


def spec_default(name: str) -> Any:
    """The value a spec loads with where ``name`` is not given (what the CLI shows as the default)."""
    f = next(f for f in dataclasses.fields(LoadOptions) if f.name == name)
    return f.metadata.get("spec_default", f.default)


def load_group(name: str, *names: str, extra: tuple[tuple[str, type, Any], ...] = ()) -> type:
    """An option group (a dataclass) of the fields ``names`` of :class:`LoadOptions` (their help
    texts, choices and checks), at the defaults a spec loads with (what a command shows: ``--device
    cpu``), then the ``extra`` fields (name, type, field) a command adds."""
    declared = {f.name: f for f in dataclasses.fields(LoadOptions)}
    fields = [
        (n, declared[n].type, field(default=spec_default(n), metadata=declared[n].metadata)) for n in names
    ]
    return dataclasses.make_dataclass(name, [*fields, *extra], kw_only=True)


__all__ = [
    "CAPTURES",
    "DEVICES",
    "DTYPES",
    "CaptureName",
    "DeviceName",
    "DtypeName",
    "LoadOptions",
    "load_group",
    "spec_default",
]
