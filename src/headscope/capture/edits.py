"""What a forward pass changes in the model: the edits, one small declared kind each.

A pass (:class:`headscope.capture.Pass`) is declared as what it reads (attention rows or pairs,
per-head writes, hidden states, token losses: :mod:`headscope.capture.reads`) and what it edits, a
list of these:

* :class:`AblateHeads`: chosen heads' outputs replaced by zeros or by their set-wide mean;
* :class:`StreamHeads`: chosen KV heads see only an attention sink and a recent window;
* :class:`PatchHeads`: a head's output (the output projection's input) replaced by a given vector,
  at one position, in chosen rows (the function-vector heads' mean-patching);
* :class:`AddVector`: a vector added to the residual stream after a block, at one position per row
  (the function vector's test);
* :class:`KeyOnly`, :class:`QueryOnly`, :class:`ValueOnly`: a write removed from one block's key
  (query, value) input only: the block's other projections and every other block see the stream
  unchanged (qk's and graph's causal checks, K-, Q- and V-composition by intervention).

The first two act inside headscope's streaming attention function, so they need streaming capture
and install no hook; the others are forward hooks. :func:`applied` is the one way to put a list
of edits on a model: ``capture.run(loaded, batches, Pass(edits=[...]))`` uses it, and so can a caller that runs the
model itself (a cached decoding step). Its hooks go through :func:`headscope.capture.hooks.hooked`
and are removed in ``finally``, also when the pass raises.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from headscope.errors import InputError, RunFailure, elide
from headscope.models import anatomy, projections

from .ablation import AblateHeads
from .batch import Batch
from .dla import attention_layers
from .hooks import Hooks, hooked
from .kvmask import StreamHeads

PositionsOf = Callable[[Batch], torch.Tensor]  # [B] one position per row


@dataclass(frozen=True)
class PatchHeads:
    """Heads of block ``layer`` whose output is replaced by a given vector.

    ``values`` maps a query head to its replacement ``[v_head_dim]``: the head's slice of the output
    projection's input, so the head's whole contribution to the residual stream becomes that of the
    vector. Only sequence position ``position`` is patched (negative: from the end, as in a one-token
    decoding step), and only the batch rows ``rows`` (None: every row), so one batch can patch a
    different head in each row.
    """

    layer: int
    values: dict[int, torch.Tensor] = field(repr=False)  # head -> [v_head_dim]
    rows: tuple[int, ...] | None = None
    position: int = -1

    def patch(self, x: torch.Tensor, n_heads: int) -> None:
        """Write the values into ``x`` ``[B, T, H * head_dim]`` (already a copy)."""
        width = x.shape[-1] // n_heads
        rows = slice(None) if self.rows is None else list(self.rows)
        for head, value in self.values.items():
            x[rows, self.position, head * width : (head + 1) * width] = value.to(
                device=x.device, dtype=x.dtype
            )


@dataclass(frozen=True)
class AddVector:
    """A vector added to the residual stream after block ``layer``, at ``positions(batch)`` (one
    position per row).

    ``vectors`` is ``[D]`` (every row gets it) or ``[N, D]`` (the row of data-set example i gets
    ``vectors[i]``, through ``batch.example_index``). It needs the pass's batch: run it through
    :func:`headscope.capture.run`, which tells :func:`applied` each batch.
    """

    layer: int
    vectors: torch.Tensor = field(repr=False)
    positions: PositionsOf = field(repr=False)

    def add(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``hidden`` ``[B, T, D]`` plus the vectors at the positions (a new tensor)."""
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        vectors = self.vectors
        if vectors.dim() == 2:
            vectors = vectors[batch.example_index.to(vectors.device)]
        delta = vectors.to(device=hidden.device, dtype=hidden.dtype)
        hidden = hidden.clone()
        hidden[rows, self.positions(batch).to(hidden.device)] += delta
        return hidden


@dataclass(frozen=True)
class _OneInput:
    """A write removed from one projection's input of block ``layer`` (the subclasses name which)."""

    layer: int
    removed: Callable[[Batch], torch.Tensor] = field(repr=False)

    side: ClassVar[str] = ""  # query, key or value
    at: ClassVar[int] = 0  # its index in projections.separate_qkv's names
    default: ClassVar[str] = ""  # the Llama name of the projection, for messages


@dataclass(frozen=True)
class QueryOnly(_OneInput):
    """A write removed from block ``layer``'s query input only.

    ``removed(batch)`` gives ``[B, T, D]``: what to take out of the block's input (the residual
    stream) before its query projection. The query projection then reads ``norm(x - removed)``,
    the block's own pre-attention norm recomputed on the changed stream (a post-norm block, which
    has none before its attention, reads ``x - removed``); the keys, the values and every other
    block read the stream unchanged. Needs separate query/key/value projections (``q_proj``; a LoRA
    adapter over one counts). Run it through :func:`headscope.capture.run`, which tells
    :func:`applied` each batch.

    Several on one layer compose (the query projection reads ``norm(x - r1 - r2 - ...)``), and so
    do :class:`KeyOnly` and :class:`ValueOnly` on the same layer: each projection reads the stream
    less its own removals. A removal of another shape than the block's input is refused
    (:class:`~headscope.errors.InputError`) at the forward that computes it.
    """

    side: ClassVar[str] = "query"
    at: ClassVar[int] = 0
    default: ClassVar[str] = "q_proj"


@dataclass(frozen=True)
class KeyOnly(_OneInput):
    """A write removed from block ``layer``'s key input only.

    ``removed(batch)`` gives ``[B, T, D]``: what to take out of the block's input (the residual
    stream) before its key projection. The key projection then reads ``norm(x - removed)``, the
    block's own pre-attention norm recomputed on the changed stream (a real intervention, not the
    frozen statistic of the decomposition; a post-norm block reads ``x - removed``); the queries and
    values read ``norm(x)`` as before. Needs a separate key projection (``k_proj``). Run it through
    :func:`headscope.capture.run`, which tells :func:`applied` each batch.

    Several on one layer compose: the key projection reads ``norm(x - r1 - r2 - ...)``, the same as
    one edit removing their sum; :class:`QueryOnly` and :class:`ValueOnly` on the same layer compose
    with them (each projection reads the stream less its own removals). A removal of another shape
    than the block's input is refused (:class:`~headscope.errors.InputError`) at the forward that
    computes it.
    """

    side: ClassVar[str] = "key"
    at: ClassVar[int] = 1
    default: ClassVar[str] = "k_proj"


@dataclass(frozen=True)
class ValueOnly(_OneInput):
    """A write removed from block ``layer``'s value input only.

    ``removed(batch)`` gives ``[B, T, D]``: the value projection then reads ``norm(x - removed)``
    (a post-norm block: ``x - removed``), and the queries, keys and every other block read the
    stream unchanged, so the block's attention weights stay as they were and only what its heads
    move changes. Needs a separate value projection (``v_proj``; a LoRA adapter over one counts).
    Composes as :class:`QueryOnly` does, with its own kind and with the other two.
    """

    side: ClassVar[str] = "value"
    at: ClassVar[int] = 2
    default: ClassVar[str] = "v_proj"


ONE_INPUT: tuple[type[_OneInput], ...] = (QueryOnly, KeyOnly, ValueOnly)


Edit = AblateHeads | StreamHeads | PatchHeads | AddVector | QueryOnly | KeyOnly | ValueOnly
KINDS: tuple[type, ...] = (AblateHeads, StreamHeads, PatchHeads, AddVector, QueryOnly, KeyOnly, ValueOnly)


class Applied:
    """The edits of one :func:`applied` block. The attention function reads ``ablation`` and
    ``streaming``; the hooks read ``batch``, which the pass sets before each forward."""

    def __init__(self, ablation: AblateHeads | None, streaming: StreamHeads | None) -> None:
        self.ablation = ablation
        self.streaming = streaming
        self.batch: Batch | None = None


def _one(edits: Sequence[Edit], kind: type) -> Any:
    found = [e for e in edits if isinstance(e, kind)]
    if len(found) > 1:
        raise InputError(
            f"one {kind.__name__} per pass, got {len(found)}", hint="merge their heads into one edit"
        )
    return found[0] if found else None


def _refuse(edit: Edit, what: str, hint: str) -> None:
    raise InputError(f"{type(edit).__name__}: {what}", hint=hint)


def _is_index(value: Any) -> bool:
    """An int (numpy's and a one-element integer tensor's too), not a bool: what a layer or head is."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _shown(value: Any) -> str:
    return f"{elide(repr(value), 40)} ({type(value).__name__})"


def _check_indices(edit: Edit) -> None:
    """Every layer and head an edit names is an int (not a bool), so that a string ``"1"`` is not
    reported as a layer the model lacks and a head ``"0"`` does not escape as a TypeError."""
    kind = type(edit).__name__
    if isinstance(edit, (AblateHeads, StreamHeads)):
        name = "heads" if isinstance(edit, AblateHeads) else "kv_heads"
        chosen = edit.heads if isinstance(edit, AblateHeads) else edit.kv_heads
        hint = f"give {name} as {{layer: (head, ...)}} of ints, or use {kind}.of([(layer, head), ...])"
        if not isinstance(chosen, dict):
            _refuse(edit, f"{name} {_shown(chosen)} is not a dict", hint)
        for layer, heads in chosen.items():
            if not _is_index(layer):
                _refuse(edit, f"{name}: layer {_shown(layer)} is not an int", hint)
            if not isinstance(heads, (tuple, list, set, frozenset)):
                _refuse(edit, f"{name}: layer {layer}'s heads {_shown(heads)} are not a tuple", hint)
            for head in heads:
                if not _is_index(head):
                    _refuse(edit, f"{name}: head {_shown(head)} of layer {layer} is not an int", hint)
        return
    if not _is_index(edit.layer):
        _refuse(
            edit,
            f"layer {_shown(edit.layer)} is not an int",
            f"give the layer as an int, 0-based: {kind}(1, ...)",
        )


def _check_one(loaded: Any, edit: Edit, attention: list[int], blocks: int) -> None:
    layout = loaded.layout
    _check_indices(edit)
    layers = (
        f"the attention layers are {attention[0]}..{attention[-1]}" if attention else "no attention layer"
    )
    if isinstance(edit, (AblateHeads, StreamHeads)):
        count = layout.n_heads if isinstance(edit, AblateHeads) else layout.n_kv_heads
        noun = "head" if isinstance(edit, AblateHeads) else "KV head"
        chosen = edit.heads if isinstance(edit, AblateHeads) else edit.kv_heads
        for layer, heads in chosen.items():
            if layer not in attention:
                _refuse(edit, f"layer {layer} has no attention", layers)
            for head in heads:
                if not 0 <= head < count:
                    _refuse(edit, f"{noun} {head} of layer {layer} does not exist", f"the model has {count}")
    elif isinstance(edit, PatchHeads):
        if edit.layer not in attention:
            _refuse(edit, f"layer {edit.layer} has no attention", layers)
        width = layout.v_head_dim
        if not isinstance(edit.values, dict):
            _refuse(edit, f"values {_shown(edit.values)} is not a dict", f"give {{head: tensor [{width}]}}")
        for head, value in edit.values.items():
            if not _is_index(head):
                _refuse(
                    edit, f"values: head {_shown(head)} is not an int", f"give {{head: tensor [{width}]}}"
                )
            if not 0 <= head < layout.n_heads:
                _refuse(edit, f"head {head} does not exist", f"the model has {layout.n_heads}")
            if not isinstance(value, torch.Tensor):
                _refuse(
                    edit,
                    f"head {head}'s value {_shown(value)} is not a tensor",
                    f"give a tensor [{width}] (one head's output)",
                )
            if tuple(value.shape) != (width,):
                _refuse(
                    edit,
                    f"head {head}'s value has shape {tuple(value.shape)}",
                    f"give [{width}] (one head's output)",
                )
    elif isinstance(edit, _OneInput):
        if edit.layer not in attention:
            _refuse(edit, f"layer {edit.layer} has no attention", layers)
        if not callable(edit.removed):
            _refuse(
                edit,
                f"removed {_shown(edit.removed)} is not a function",
                f"give a function of the batch that returns what to take out of layer {edit.layer}'s "
                f"{edit.side} input, [batch, tokens, d_model]: a source's write, not its name",
            )
        module = projections.attention_module(anatomy.blocks(loaded.model)[edit.layer])
        if _projection(module, edit) is None:
            _refuse(
                edit,
                f"{type(module).__name__} has no separate {edit.side} projection ({edit.default})",
                f"a fused query/key/value projection cannot be edited on the {edit.side} side alone",
            )
    elif isinstance(edit, AddVector):
        if not 0 <= edit.layer < blocks:
            _refuse(edit, f"layer {edit.layer} is not a block", f"the blocks are 0..{blocks - 1}")
        if not isinstance(edit.vectors, torch.Tensor):
            _refuse(
                edit,
                f"vectors {_shown(edit.vectors)} is not a tensor",
                f"give a tensor [{layout.d_model}] or [examples, {layout.d_model}]",
            )
        if not callable(edit.positions):
            _refuse(
                edit,
                f"positions {_shown(edit.positions)} is not a function",
                "give a function of the batch that returns one position per row, [batch]",
            )
        if edit.vectors.dim() not in (1, 2) or edit.vectors.shape[-1] != layout.d_model:
            _refuse(
                edit,
                f"vectors of shape {tuple(edit.vectors.shape)}",
                f"give [{layout.d_model}] or [examples, {layout.d_model}]",
            )


def _projection(attention: torch.nn.Module, edit: _OneInput) -> torch.nn.Module | None:
    """The attention module's separate projection that ``edit`` changes the input of, or None
    (fused projections, or no separate value projection)."""
    names = projections.separate_qkv(attention)
    if names is None:
        return None
    try:
        return attention.get_submodule(names[edit.at])
    except AttributeError:
        return None


def _checked(loaded: Any, edits: Iterable[Edit | None]) -> list[Edit]:
    listed = [e for e in edits if e is not None]
    for edit in listed:
        if not isinstance(edit, KINDS):
            names = ", ".join(k.__name__ for k in KINDS)
            raise TypeError(f"not an edit: {edit!r} (the edits are {names})")
    sink_side = [e for e in listed if isinstance(e, (AblateHeads, StreamHeads))]
    if sink_side and loaded.capture_mode != "stream":
        what = "head ablation needs" if isinstance(sink_side[0], AblateHeads) else "streaming KV heads need"
        raise RunFailure(f"{what} streaming capture", hint="drop --capture eager")
    if not listed:
        return listed  # nothing to check: a plain pass needs no block (ALBERT's shared layer has none)
    attention = attention_layers(loaded)
    blocks = len(anatomy.blocks(loaded.model))
    for edit in listed:
        _check_one(loaded, edit, attention, blocks)
    return listed


def _install(loaded: Any, edits: Sequence[Edit], live: Applied, hooks: Hooks) -> None:
    if not any(isinstance(edit, (PatchHeads, AddVector, *ONE_INPUT)) for edit in edits):
        return  # AblateHeads and StreamHeads act in the attention function, not by hooks
    blocks = anatomy.blocks(loaded.model)
    n_heads = loaded.layout.n_heads
    patches: dict[int, list[PatchHeads]] = {}
    for edit in edits:
        if isinstance(edit, PatchHeads):
            patches.setdefault(edit.layer, []).append(edit)
    for layer, chosen in patches.items():
        module = projections.output_module(projections.attention_module(blocks[layer]))

        def patch(_module: Any, args: tuple, chosen: list[PatchHeads] = chosen) -> tuple:
            x = args[0].clone()  # [B, T, H * head_dim]
            for edit in chosen:
                edit.patch(x, n_heads)
            return (x, *args[1:])

        hooks.before(module, patch)
    for edit in edits:
        if isinstance(edit, AddVector):

            def add(_module: Any, _args: Any, output: Any, edit: AddVector = edit) -> Any:
                if live.batch is None:
                    raise RunFailure("AddVector needs the pass's batch: run it through capture.run")
                hidden = output[0] if isinstance(output, tuple) else output
                hidden = edit.add(hidden, live.batch)
                return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

            hooks.after(blocks[edit.layer], add)
    inputs: dict[int, list[_OneInput]] = {}
    for edit in edits:
        if isinstance(edit, _OneInput):
            inputs.setdefault(operator.index(edit.layer), []).append(edit)
    for layer, chosen in inputs.items():
        _one_input(chosen, blocks[layer], live, hooks)


def _removal(edit: _OneInput, batch: Batch, x: torch.Tensor) -> torch.Tensor:
    """What ``edit`` takes out of ``x`` ``[B, T, D]`` for this batch, refused unless it has x's shape."""
    removed = edit.removed(batch)
    want = f"[batch, tokens, d_model] = {list(x.shape)}, layer {edit.layer}'s input for this batch"
    if not isinstance(removed, torch.Tensor):
        _refuse(edit, f"removed(batch) returned {_shown(removed)}, not a tensor", f"return {want}")
    if tuple(removed.shape) != tuple(x.shape):
        _refuse(
            edit, f"removed(batch) has shape {list(removed.shape)}, not the block input's", f"return {want}"
        )
    return removed.to(device=x.device, dtype=x.dtype)


def _one_input(chosen: list[_OneInput], block: torch.nn.Module, live: Applied, hooks: Hooks) -> None:
    """The query-, key- and value-only edits of one block: one hook keeps the block's input x, and
    one hook per projection edited makes it read ``norm(x - r1 - r2 - ...)``, the removals of its
    own kind, so edits of one kind sum and edits of different kinds each reach only their projection."""
    attention = projections.attention_module(block)
    norm = projections.input_norm(block)
    seen: dict[str, torch.Tensor] = {}

    def keep(_module: Any, args: tuple, kwargs: dict) -> None:
        seen["x"] = args[0] if args else kwargs["hidden_states"]

    def replacing(mine: list[_OneInput]) -> Callable[[Any, tuple], tuple]:
        def replace(_module: Any, args: tuple) -> tuple:
            if live.batch is None:
                raise RunFailure(
                    f"{type(mine[0]).__name__} needs the pass's batch: run it through capture.run"
                )
            x = seen["x"]
            changed = x
            for edit in mine:
                changed = changed - _removal(edit, live.batch, x)
            return (norm(changed) if norm is not None else changed, *args[1:])

        return replace

    hooks.before(block, keep, with_kwargs=True)
    for kind in ONE_INPUT:
        mine = [edit for edit in chosen if isinstance(edit, kind)]
        if mine:
            module = _projection(attention, mine[0])
            assert module is not None  # checked before the pass
            hooks.before(module, replacing(mine))


@contextlib.contextmanager
def applied(loaded: Any, edits: Iterable[Edit | None]) -> Iterator[Applied]:
    """Put ``edits`` on ``loaded``'s model for the length of the block (None entries are skipped).

    Checked before any hook goes on (:class:`~headscope.errors.InputError` naming the edit): a known
    kind, layers and heads given as ints that the model has, values of one head's width and vectors of
    the model's, functions where a function goes, at most one :class:`AblateHeads` and one
    :class:`StreamHeads`, and streaming capture for those two. Several :class:`QueryOnly`,
    :class:`KeyOnly` and :class:`ValueOnly` on one layer compose; a removal's shape is checked at the
    forward that computes it. Every hook is removed in
    ``finally``, whatever the pass inside did.
    """
    listed = _checked(loaded, edits)
    live = Applied(_one(listed, AblateHeads), _one(listed, StreamHeads))
    with hooked() as hooks:
        _install(loaded, listed, live, hooks)
        yield live


__all__ = [
    "AblateHeads",
    "AddVector",
    "Applied",
    "Edit",
    "KINDS",
    "KeyOnly",
    "ONE_INPUT",
    "PatchHeads",
    "QueryOnly",
    "StreamHeads",
    "ValueOnly",
    "applied",
]
