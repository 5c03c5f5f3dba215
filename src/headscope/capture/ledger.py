"""A cost ledger: what each part of a run costs, as a multiple of a bare forward over its tokens.

While :func:`recording` is active, every forward pass :func:`headscope.capture.run` makes is noted
under the current part (:func:`part`; "run" outside any): its batch shape, and the share of the
layers it ran (a pass that stops early counts for less). :meth:`Ledger.costs` then measures a bare
forward, the base model with the fused SDPA attention and no weights, on a *sample*: one batch of
random tokens per length bucket (powers of two), at the largest shape recorded in that bucket. Its
seconds per token are scaled by each part's token count in that bucket. A pass that read next-token
losses (:class:`~headscope.capture.reads.TokenLosses`) needed the LM head at every position, so its
bare forward is the model's whole forward, ``model(...).logits``: the LM head as that runs it (and
Gemma's soft-capping), timed on :data:`HEAD_SAMPLE` positions, is added per position. A part's
ratio is its wall time over that estimate: 1.0 means the part cost what its forward passes would
cost with nothing measured. Work that is not a full forward (path patching's single-block reruns,
the statistics) is in the part's time and not in the estimate, so it shows up in the ratio.
:attr:`PartCost.ratio_base` leaves the LM head out of the estimate.
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
from .logits import output_logits

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
    bare_seconds: float | None  # the base model's passes, plus the LM head where a pass read losses
    head_seconds: float = 0.0  # the LM head's share of bare_seconds

    @property
    def ratio(self) -> float | None:
        if not self.bare_seconds:
            return None
        return self.seconds / self.bare_seconds

    @property
    def ratio_base(self) -> float | None:
        """The wall time over the base model's passes alone (no LM head in the estimate)."""
        if not self.bare_seconds or not self.bare_seconds - self.head_seconds:
            return None
        return self.seconds / (self.bare_seconds - self.head_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "passes": self.passes,
            "bare_seconds": self.bare_seconds,
            "head_seconds": self.head_seconds,
            "ratio": self.ratio,
            "ratio_base": self.ratio_base,
        }


@dataclass
class Ledger:
    """Forward passes per part: (batch, length, share of layers run, whether the LM head ran)."""

    passes: dict[str, list[tuple[int, int, float, bool]]] = field(default_factory=dict)
    sample: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # bucket -> (B, T, s)
    head_rate: float | None = None  # seconds per position of the LM head, once measured

    def note(self, batch: int, length: int, share: float = 1.0, head: bool = False) -> None:
        """One forward pass under the current part; ``head``: it ran the LM head at every position."""
        self.passes.setdefault(_PART.get(), []).append((batch, length, share, head))

    def measure(self, loaded: Any) -> dict[int, float]:
        """Seconds per token of a bare forward, per length bucket, from one timed batch each; and,
        when some pass ran the LM head, its seconds per position (:attr:`head_rate`)."""
        wanted: dict[int, tuple[int, int]] = {}
        heads = any(head for shapes in self.passes.values() for *_, head in shapes)
        for shapes in self.passes.values():
            for batch, length, _, _ in shapes:
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
                    out = loaded.base(**inputs)
                    _sync(loaded.device)
                    seconds = time.perf_counter() - started
                    self.sample[bucket] = (batch, length, seconds)
                    rates[bucket] = seconds / (batch * length)
                    if heads and self.head_rate is None:
                        self.head_rate = _head_rate(loaded, out.last_hidden_state)
            finally:
                model.set_attn_implementation(before if before is not None else "eager")
        return rates

    def costs(self, loaded: Any, seconds: dict[str, float]) -> list[PartCost]:
        """Each part of ``seconds`` (wall time per part) against its bare-forward estimate."""
        rates = self.measure(loaded) if self.passes else {}
        out = []
        for name, wall in seconds.items():
            shapes = self.passes.get(name, [])
            tokens = sum(b * t * share for b, t, share, _ in shapes)
            base = sum(rates[_bucket(t)] * b * t * share for b, t, share, _ in shapes)
            # B x T positions, as ``model(...).logits`` runs the head (the losses read T - 1 of
            # them; the estimate is what the bare forward costs, not what the analysis reads).
            head = sum((self.head_rate or 0.0) * b * t for b, t, _, ran in shapes if ran)
            out.append(PartCost(name, wall, tokens, len(shapes), base + head if shapes else None, head))
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


HEAD_SAMPLE = 256  # positions the LM head is timed on (its cost per position does not depend on T)


def _head_rate(loaded: Any, hidden: torch.Tensor) -> float:
    """Seconds per position of the LM head as ``model(...).logits`` runs it (every logit of the
    vocabulary, then soft-capping where the config sets it), on up to :data:`HEAD_SAMPLE` positions
    of ``hidden``, after one warm-up."""
    states = hidden.reshape(-1, hidden.shape[-1])[:HEAD_SAMPLE]
    output_logits(loaded, states)
    _sync(loaded.device)
    started = time.perf_counter()
    output_logits(loaded, states)
    _sync(loaded.device)
    return (time.perf_counter() - started) / states.shape[0]


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
