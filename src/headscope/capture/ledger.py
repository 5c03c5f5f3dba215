"""A cost ledger: what each part of a run costs, as a multiple of a bare forward over its tokens.

While :func:`recording` is active, every forward pass :func:`headscope.capture.run` makes is noted
under the current part (:func:`part`; "run" outside any): its batch shape, and the share of the
layers it ran (a pass that stops early counts for less). :meth:`Ledger.costs` then measures a bare
forward, the base model with the fused SDPA attention and no weights, on a *sample*: one batch of
random tokens per length bucket (powers of two), at the largest shape recorded in that bucket. Its
seconds per token are scaled by each part's token count in that bucket. A part's ratio is its wall
time over that estimate: 1.0 means the part cost what its forward passes would cost with nothing
measured. Work that is not a full forward (path patching's single-block reruns, the LM head, the
statistics) is in the part's time and not in the estimate, so it shows up in the ratio.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from .borrow import borrowed

_LEDGER: ContextVar[Ledger | None] = ContextVar("headscope_ledger", default=None)
_PART: ContextVar[str] = ContextVar("headscope_ledger_part", default="run")


def _bucket(length: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, length))))


@dataclass
class PartCost:
    """One part: its wall seconds, the tokens its passes ran, and the bare-forward estimate."""

    part: str
    seconds: float
    tokens: float  # layer-weighted: a pass that stops at half the layers counts half its tokens
    passes: int
    bare_seconds: float | None

    @property
    def ratio(self) -> float | None:
        if not self.bare_seconds:
            return None
        return self.seconds / self.bare_seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "passes": self.passes,
            "bare_seconds": self.bare_seconds,
            "ratio": self.ratio,
        }


@dataclass
class Ledger:
    """Forward passes per part: (batch, length, share of layers run)."""

    passes: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    sample: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # bucket -> (B, T, s)

    def note(self, batch: int, length: int, share: float = 1.0) -> None:
        self.passes.setdefault(_PART.get(), []).append((batch, length, share))

    def measure(self, loaded: Any) -> dict[int, float]:
        """Seconds per token of a bare forward, per length bucket, from one timed batch each."""
        wanted: dict[int, tuple[int, int]] = {}
        for shapes in self.passes.values():
            for batch, length, _ in shapes:
                bucket = _bucket(length)
                if bucket not in wanted or batch * length > wanted[bucket][0] * wanted[bucket][1]:
                    wanted[bucket] = (batch, length)
        rates = {}
        model = loaded.model
        vocab = model.get_input_embeddings().num_embeddings
        with borrowed(loaded), torch.inference_mode():
            before = getattr(model.config, "_attn_implementation", None)
            model.set_attn_implementation("sdpa")
            try:
                for bucket, (batch, length) in sorted(wanted.items()):
                    generator = torch.Generator().manual_seed(bucket)
                    ids = torch.randint(vocab, (batch, length), generator=generator).to(loaded.device)
                    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
                    if loaded.is_causal:
                        inputs["use_cache"] = False
                    if not self.sample:
                        loaded.base(**inputs)  # warm-up, once
                    _sync(loaded.device)
                    started = time.perf_counter()
                    loaded.base(**inputs)
                    _sync(loaded.device)
                    seconds = time.perf_counter() - started
                    self.sample[bucket] = (batch, length, seconds)
                    rates[bucket] = seconds / (batch * length)
            finally:
                model.set_attn_implementation(before if before is not None else "eager")
        return rates

    def costs(self, loaded: Any, seconds: dict[str, float]) -> list[PartCost]:
        """Each part of ``seconds`` (wall time per part) against its bare-forward estimate."""
        rates = self.measure(loaded) if self.passes else {}
        out = []
        for name, wall in seconds.items():
            shapes = self.passes.get(name, [])
            tokens = sum(b * t * share for b, t, share in shapes)
            bare = sum(rates[_bucket(t)] * b * t * share for b, t, share in shapes) if shapes else None
            out.append(PartCost(name, wall, tokens, len(shapes), bare))
        return out

    def profile(self, loaded: Any, load_seconds: float, timings: dict[str, float], run: float) -> Profile:
        """The profile of a run recorded in this ledger: ``timings`` are its timed steps (wall seconds);
        "run" is the rest of ``run`` seconds (all of it when the analysis has no steps)."""
        seconds = {**timings, "run": run - sum(timings.values())}
        return Profile(load_seconds, self.costs(loaded, seconds))


@dataclass
class Profile:
    """Where a run's time went: loading the model, then each part's cost (:class:`PartCost`)."""

    load_seconds: float
    costs: list[PartCost]

    @property
    def seconds(self) -> float:
        return self.load_seconds + sum(cost.seconds for cost in self.costs)

    def to_json(self) -> dict[str, Any]:
        return {"load_seconds": self.load_seconds, "parts": [cost.to_json() for cost in self.costs]}


def _sync(device: Any) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def active() -> Ledger | None:
    return _LEDGER.get()


@contextlib.contextmanager
def recording() -> Iterator[Ledger]:
    """Note every forward pass made inside the block."""
    ledger = Ledger()
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Passes made inside the block are noted under ``name``."""
    token = _PART.set(name)
    try:
        yield
    finally:
        _PART.reset(token)
