"""Path patching into a block's queries.

To ask whether a sender head's output reaches a receiver head through the receiver's *query*
(and through nothing else), the receiver's block is run again on the clean residual stream plus
the change the sender would make at one position, while the block's keys and values are held at
their clean values. Only the queries see the change, and no block between sender and receiver
recomputes anything: the sender's effect is restricted to the direct path into the receivers'
queries (Wang et al. 2022, path patching to the name movers' queries).

:func:`record_block_inputs` runs the clean forward pass once and keeps, for each receiver
block, the arguments it was called with and its keys and values; :func:`rerun_block` replays one
block on a changed residual stream and hands its attention weights to a callback.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import RunFailure
from headscope.models.anatomy import blocks as model_blocks

from .batch import Batch
from .dla import HeadWrites
from .hooks import hooked
from .stream import LayerCallback, _sink, model_inputs, prepared, stopping_after


@dataclass
class BlockInputs:
    """What one block received in the clean pass: its hidden states, other arguments, K and V."""

    hidden: torch.Tensor  # [B, T, D]
    args: tuple
    kwargs: dict[str, Any]
    kv: tuple[torch.Tensor, torch.Tensor]


def _noop(*_: Any) -> None:
    return None


def record_block_inputs(
    loaded: Any, batch: Batch, layers: Iterable[int], writes: HeadWrites | None = None
) -> dict[int, BlockInputs]:
    """One clean forward pass of ``batch`` that keeps each block of ``layers``' inputs, K and V.

    ``writes`` (optional) records the heads' writes in the same pass.
    """
    if loaded.capture_mode != "stream":
        raise RunFailure("path patching needs streaming capture", hint="drop --capture eager")
    wanted = sorted(set(layers))
    blocks = model_blocks(loaded.model)
    saved: dict[int, tuple[torch.Tensor, tuple, dict]] = {}

    def pre(_module: Any, args: tuple, kwargs: dict, layer: int) -> None:
        if args:
            saved[layer] = (args[0].detach().clone(), args[1:], dict(kwargs))
        else:
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            saved[layer] = (kwargs["hidden_states"].detach().clone(), (), rest)

    on_device = batch.to(loaded.device)
    inputs = model_inputs(loaded, on_device)
    with hooked() as hooks:
        for layer in wanted:
            hooks.before(blocks[layer], functools.partial(pre, layer=layer), with_kwargs=True)
        if writes is not None:
            writes.begin(on_device)
        with (
            prepared(loaded),
            torch.inference_mode(),
            _sink(None, on_device) as sink,
            writes.hooked() if writes is not None else contextlib.nullcontext(),
        ):
            sink.record_kv = set(wanted)
            # Blocks after the last wanted one cannot change what is recorded: the pass stops there.
            with stopping_after(loaded, max(wanted)) as stopped:
                stopped(loaded.base, inputs)
        if writes is not None:
            writes.finish()
    missing = [layer for layer in wanted if layer not in saved or layer not in sink.kv]
    if missing:
        raise RunFailure(f"path patching: blocks {missing} were not seen in the forward pass")
    return {
        layer: BlockInputs(saved[layer][0], saved[layer][1], saved[layer][2], sink.kv[layer])
        for layer in wanted
    }


def _tile(value: Any, rows: int, copies: int) -> Any:
    """Repeat every tensor whose first dimension is the batch ``copies`` times along it."""
    if copies == 1:
        return value
    if isinstance(value, torch.Tensor):
        if value.dim() > 0 and value.shape[0] == rows:
            return value.repeat(copies, *([1] * (value.dim() - 1)))
        return value
    if isinstance(value, tuple):
        return tuple(_tile(v, rows, copies) for v in value)
    if isinstance(value, list):
        return [_tile(v, rows, copies) for v in value]
    if isinstance(value, dict):
        return {k: _tile(v, rows, copies) for k, v in value.items()}
    return value


def _select(value: Any, index: torch.Tensor, positions: torch.Tensor, length: int) -> Any:
    """Keep only each row's query at ``positions`` in the block's per-position arguments.

    Masks ``[b, h, T, T]`` keep that query's row; per-position tensors ``[b, T, ...]`` (rotary
    cos/sin, position ids) keep that position. ``b`` is the batch or 1 (broadcast).
    """
    if isinstance(value, tuple):
        return tuple(_select(v, index, positions, length) for v in value)
    if isinstance(value, list):
        return [_select(v, index, positions, length) for v in value]
    if isinstance(value, dict):
        return {k: _select(v, index, positions, length) for k, v in value.items()}
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return value
    rows = index if value.shape[0] > 1 else torch.zeros_like(index)
    if value.dim() == 4 and value.shape[-2] == length and value.shape[-1] == length:
        return value[rows, :, positions][:, :, None, :]
    if value.shape[1] == length:
        return value[rows, positions][:, None]
    return value


def rerun_block(
    loaded: Any,
    layer: int,
    inputs: BlockInputs,
    batch: Batch,
    delta: torch.Tensor | None,
    positions: torch.Tensor,
    on_layer: LayerCallback,
    *,
    only_positions: bool = False,
) -> None:
    """Run block ``layer`` again with ``delta`` added to the residual at ``positions[B]``.

    With ``only_positions`` the block computes just the query (and MLP) at ``positions``: since
    keys and values are held at their clean values, the other queries cannot change, and this is
    about T times cheaper. ``on_layer`` then gets one query row per row, ``[rows, H, 1, T]``.

    ``delta`` is ``[B, D]``, or ``[S, B, D]`` for S alternative changes run side by side as
    S copies of the batch (row ``s * B + b`` of the weights is copy s of row b). Keys and values
    stay as recorded, so only the queries change. ``on_layer`` receives the block's attention
    weights as in :func:`headscope.capture.run`, with a batch whose rows are the copies.
    """
    rows = inputs.hidden.shape[0]
    copies = 1 if delta is None or delta.dim() == 2 else delta.shape[0]
    hidden = inputs.hidden.repeat(copies, 1, 1)
    if delta is not None:
        flat = delta.reshape(copies * rows, -1).to(device=hidden.device, dtype=hidden.dtype)
        index = torch.arange(copies * rows, device=hidden.device)
        hidden[index, positions.to(hidden.device).repeat(copies)] += flat
    block = model_blocks(loaded.model)[layer]
    on_device = batch.to(loaded.device)
    if copies > 1:
        on_device = Batch(
            on_device.input_ids.repeat(copies, 1),
            on_device.attention_mask.repeat(copies, 1),
            on_device.special.repeat(copies, 1),
            on_device.example_index.repeat(copies),
            on_device.is_causal,
            list(on_device.meta) * copies,
        )
    args = _tile(inputs.args, rows, copies)
    kwargs = _tile(inputs.kwargs, rows, copies)
    kv = _tile(inputs.kv, rows, copies)
    if only_positions:
        length = hidden.shape[1]
        index = torch.arange(hidden.shape[0], device=hidden.device)
        at = positions.to(hidden.device).repeat(copies)
        hidden = hidden[index, at][:, None]
        args = _select(args, index, at, length)
        kwargs = _select(kwargs, index, at, length)
    with prepared(loaded), torch.inference_mode(), _sink(on_layer, on_device) as sink:
        sink.kv_override = {layer: kv}
        block(hidden, *args, **kwargs)
