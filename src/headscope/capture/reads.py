"""What a forward pass reads: the reads, one small declared kind each (as :mod:`.edits` declares the edits).

A pass (:class:`headscope.capture.Pass`) is declared as what it reads and what it edits; these are
the reads, at most one of each kind per pass:

* :class:`Attention`: each layer's attention weights, chunk by chunk, for the query rows ``rows``
  selects (:mod:`headscope.capture.rows`), or the weights at declared pairs;
* :class:`TokenLosses`: each position's next-token loss (the LM head runs a slice of the vocabulary at a time);
* :class:`FinalHidden`: the final hidden states (after the final norm);
* :class:`~headscope.capture.dla.HeadWrites`: each head's write at one position per row, and its
  direct logit attribution;
* :class:`~headscope.capture.ablation.HeadOutputMeans`: chosen heads' mean outputs over the set
  (mean ablation's calibration; streaming capture only);
* :class:`BlockRecorder`: chosen blocks' inputs, keys and values, for path patching's replays
  (streaming capture only);
* :class:`~headscope.capture.sources.SourceWrites`: blocks' inputs, attention inputs and heads'
  outputs at every position, for the decomposition of attention scores over their sources (qk).

:func:`check` refuses what a model cannot give (a streaming-only read in eager capture, losses
without an LM head) and what a pass cannot give (final states from a pass that stops early), each
naming the read, before any forward pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import InputError, RunFailure

from . import rows
from .ablation import HeadOutputMeans
from .batch import Batch
from .dla import HeadWrites
from .hooks import hooked
from .rows import Reads
from .sources import SourceWrites

# on_layer(layer, weights[B, H, c, K'], batch, q_start): weights of queries q_start..q_start+c-1.
LayerCallback = Callable[[int, torch.Tensor, "Batch", int], None]
# on_pairs(layer, [PairWeights per reader], batch): the weights at the pairs the readers declared.
PairCallback = Callable[[int, "list[rows.PairWeights]", "Batch"], None]
# on_layer_done(layer, batch): after a layer's last chunk.
LayerDone = Callable[[int, "Batch"], None]
# (tensor, batch): a [B, T-1] loss or a [B, T, D] final hidden state of one batch.
BatchCallback = Callable[[torch.Tensor, "Batch"], None]


@dataclass(frozen=True)
class Attention:
    """Each layer's attention weights.

    ``on_layer(layer, weights, batch, q_start)`` receives float32 weights ``[B, H, c, K']`` for the
    queries ``q_start .. q_start + c - 1``, in order; ``K'`` may stop short of the batch's length
    when the keys after the chunk are all masked (their weight is 0). It must not modify
    ``weights``. ``on_layer_done(layer, batch)`` follows a layer's last chunk.

    ``rows(batch)`` declares the query rows ``on_layer`` reads (:mod:`headscope.capture.rows`;
    None: every row): only those get exact weights, every other row runs through the fused SDPA
    kernel. When ``rows`` gives :class:`~headscope.capture.rows.Pairs` and ``on_pairs`` is set, no
    row gets weights: ``on_pairs(layer, [PairWeights per part], batch)`` receives the weights at
    the pairs, from the fused kernel's log-sum-exp (where a layer cannot, its pairs' rows are
    computed exactly and go to ``on_layer`` instead, so ``on_pairs`` needs ``on_layer``).
    ``on_layer=None`` reads no row (every layer runs fused): for a pass that only wants
    ``on_layer_done``.
    """

    on_layer: LayerCallback | None = None
    rows: Reads | None = None
    on_pairs: PairCallback | None = None
    on_layer_done: LayerDone | None = None

    def __post_init__(self) -> None:
        if self.on_layer is None:
            given = [name for name in ("rows", "on_pairs") if getattr(self, name) is not None]
            if given:
                raise InputError(
                    f"Attention: {' and '.join(given)} without on_layer reads nothing",
                    hint="give on_layer (it also receives the rows a layer cannot give as pairs)",
                )


@dataclass(frozen=True)
class TokenLosses:
    """Next-token losses: ``on_losses(losses, batch)`` receives ``[B, T-1]`` float32 losses of
    predicting token t+1 at position t, computed from the final hidden states a vocabulary slice at
    a time (:func:`headscope.capture.next_token_losses`), so no ``[B, T, vocab]`` logits ever exist. The
    LM head runs only for a pass with this read; the model must have one."""

    on_losses: BatchCallback


@dataclass(frozen=True)
class FinalHidden:
    """The final hidden states: ``on_hidden(hidden, batch)`` receives ``[B, T, D]`` (after the
    final norm), for logits at a few positions."""

    on_hidden: BatchCallback


@dataclass
class BlockInputs:
    """What one block received in a clean pass: its hidden states, its other arguments, its K and V.

    ``hidden`` is ``[B, T, D]``, or ``[B, 1, D]`` with ``at`` set: only row b's position ``at[b]``
    was kept (all a replay of that position's query needs). ``kv`` are the attention's keys and
    values as the attention function received them (``[B, KV heads, T, head_dim]``).
    """

    hidden: torch.Tensor
    args: tuple
    kwargs: dict[str, Any]
    kv: tuple[torch.Tensor, torch.Tensor]
    at: torch.Tensor | None = None
    block: torch.nn.Module | None = None  # the block itself, so that a replay need not look it up

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.hidden, *self.kv))


class BlockRecorder:
    """A read of a forward pass: each block of ``layers``' inputs, keys and values, for path
    patching's replays (:mod:`headscope.capture.patching`).

    With ``positions_of`` only one position per row of the hidden states is kept (``BlockInputs.at``).
    Like :class:`HeadWrites`, ``begin`` and ``finish`` run around each batch; after ``finish``,
    ``recorded`` holds that batch's ``{layer: BlockInputs}`` (complete when the pass's
    ``on_batch_done`` is called). Streaming capture only: the keys and values are taken in the
    streaming attention function.
    """

    def __init__(
        self, loaded: Any, layers: Iterable[int], positions_of: Callable[[Batch], torch.Tensor] | None = None
    ) -> None:
        from headscope.models.anatomy import blocks

        if loaded.capture_mode != "stream":
            raise RunFailure("path patching needs streaming capture", hint="drop --capture eager")
        self.layers = sorted(set(layers))
        self.positions_of = positions_of
        self._blocks = blocks(loaded.model)
        self._at: torch.Tensor | None = None
        self._saved: dict[int, tuple[torch.Tensor, tuple, dict[str, Any]]] = {}
        self.recorded: dict[int, BlockInputs] = {}

    def begin(self, batch: Batch) -> None:
        self._saved = {}
        self.recorded = {}
        self._at = None if self.positions_of is None else self.positions_of(batch).to(batch.input_ids.device)

    def _pre(self, layer: int) -> Callable[..., None]:
        def hook(_module: Any, args: tuple, kwargs: dict) -> None:
            if args:
                hidden, rest, named = args[0], args[1:], dict(kwargs)
            else:
                hidden, rest = kwargs["hidden_states"], ()
                named = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            if self._at is None:
                kept = hidden.detach().clone()
            else:
                index = torch.arange(hidden.shape[0], device=hidden.device)
                kept = hidden.detach()[index, self._at.to(hidden.device)][:, None]  # a copy
            self._saved[layer] = (kept, rest, named)

        return hook

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        with hooked() as hooks:
            for layer in self.layers:
                hooks.before(self._blocks[layer], self._pre(layer), with_kwargs=True)
            yield

    def finish(self, kv: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Join each block's inputs with its keys and values (the sink's ``kv``)."""
        missing = [layer for layer in self.layers if layer not in self._saved or layer not in kv]
        if missing:
            raise RunFailure(f"path patching: blocks {missing} were not seen in the forward pass")
        at = None if self._at is None else self._at.cpu()
        self.recorded = {
            layer: BlockInputs(*self._saved[layer], kv[layer], at, self._blocks[layer])  # type: ignore[misc]
            for layer in self.layers
        }
        self._saved = {}


Read = Attention | TokenLosses | FinalHidden | HeadWrites | HeadOutputMeans | BlockRecorder | SourceWrites
KINDS: tuple[type, ...] = (
    Attention,
    TokenLosses,
    FinalHidden,
    HeadWrites,
    HeadOutputMeans,
    BlockRecorder,
    SourceWrites,
)
# What each read is for, in a refusal a user may see (the CLI prints it).
_WHAT = {
    HeadOutputMeans: "head ablation's mean outputs",
    BlockRecorder: "path patching's block inputs",
}
STREAM_ONLY: tuple[type, ...] = (HeadOutputMeans, BlockRecorder)
FINAL_STATES: tuple[type, ...] = (TokenLosses, FinalHidden)  # reads of the pass's end


def listed(reads: Iterable[Read | None]) -> tuple[Read, ...]:
    """``reads`` without None entries, each a known kind, at most one of each (else refused)."""
    out = tuple(read for read in reads if read is not None)
    for read in out:
        if not isinstance(read, KINDS):
            names = ", ".join(kind.__name__ for kind in KINDS)
            raise TypeError(f"not a read: {read!r} (the reads are {names})")
    for kind in KINDS:
        found = sum(isinstance(read, kind) for read in out)
        if found > 1:
            raise InputError(
                f"one {kind.__name__} read per pass, got {found}",
                hint="merge them into one read (rows.union joins row selections), or run two passes",
            )
    return out


def check(loaded: Any, reads: Iterable[Read], stop_after: int | None) -> None:
    """Refuse reads this model or this pass cannot give, naming the read (before any forward pass)."""
    stream = loaded.capture_mode == "stream"
    for read in reads:
        name = type(read).__name__
        if isinstance(read, STREAM_ONLY) and not stream:
            raise RunFailure(
                f"{name}: {_WHAT[type(read)]} need streaming capture", hint="drop --capture eager"
            )
        if isinstance(read, TokenLosses) and not loaded.has_lm_head:
            raise RunFailure(f"{name}: next-token losses need a language model with an LM head")
        if stop_after is not None and isinstance(read, FINAL_STATES):
            raise InputError(
                f"{name}: a pass with stop_after={stop_after} ends early and has no final states",
                hint=f"drop stop_after or the {name} read",
            )
    if stop_after is not None and not stream:
        raise RunFailure(f"stop_after={stop_after} needs streaming capture", hint="drop --capture eager")


__all__ = [
    "Attention",
    "BlockInputs",
    "BlockRecorder",
    "FinalHidden",
    "HeadOutputMeans",
    "HeadWrites",
    "KINDS",
    "LayerCallback",
    "LayerDone",
    "PairCallback",
    "Read",
    "TokenLosses",
    "check",
    "listed",
]
