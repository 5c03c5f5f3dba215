"""Path patching into a block's queries.

To ask whether a sender head's output reaches a receiver head through the receiver's *query*
(and through nothing else), the receiver's block is run again on the clean residual stream plus
the change the sender would make at one position, while the block's keys and values are held at
their clean values. Only the queries see the change, and no block between sender and receiver
recomputes anything: the sender's effect is restricted to the direct path into the receivers'
queries (Wang et al. 2022, path patching to the name movers' queries).

:class:`~headscope.capture.reads.BlockRecorder` keeps, for each receiver block, the arguments it
was called with and its keys and values, as a read of a clean pass
(``capture.run(loaded, batches, Pass(reads=[BlockRecorder(...), ...]))``);
:func:`record_block_inputs` runs a clean pass of its own for that. :func:`rerun_block` replays one
block on a changed residual stream, hands its attention weights to a callback, and ends the block
there: nothing after the attention weights is computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from headscope.errors import RunFailure
from headscope.models.anatomy import blocks as model_blocks

from .batch import Batch
from .dla import HeadWrites
from .reads import BlockInputs, BlockRecorder, LayerCallback
from .stream import (
    _sink,
    _Stop,
    model_inputs,
    prepared,
    stopping_after,
)

__all__ = ["BlockInputs", "BlockRecorder", "record_block_inputs", "rerun_block"]


def record_block_inputs(
    loaded: Any, batch: Batch, layers: Iterable[int], writes: HeadWrites | None = None
) -> dict[int, BlockInputs]:
    """One clean forward pass of ``batch`` that keeps each block of ``layers``' inputs, K and V.

    ``writes`` (optional) records the heads' writes in the same pass. A pass that is already made
    can keep them itself instead: ``Pass(reads=[BlockRecorder(...), ...])``.
    """
    recorder = BlockRecorder(loaded, layers)
    on_device = batch.to(loaded.device)
    inputs = model_inputs(loaded, on_device)
    recorder.begin(on_device)
    if writes is not None:
        writes.begin(on_device)
    with (
        recorder.hooked(),
        prepared(loaded),
        torch.inference_mode(),
        _sink(None, on_device) as sink,
        writes.hooked() if writes is not None else contextlib.nullcontext(),
    ):
        sink.record_kv = set(recorder.layers)
        # Blocks after the last wanted one cannot change what is recorded: the pass stops there.
        with stopping_after(loaded, max(recorder.layers)) as stopped:
            stopped(loaded.base, inputs)
    if writes is not None:
        writes.finish()
    recorder.finish(sink.kv)
    return recorder.recorded


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


def _select(value: Any, index: torch.Tensor, positions: torch.Tensor, length: int, copies: int = 1) -> Any:
    """Keep only each row's query at ``positions`` in the block's per-position arguments, as
    ``copies`` queries side by side (all at that position).

    Masks ``[b, h, T, T]`` keep that query's row (``[B, h, copies, T]``); per-position tensors
    ``[b, T, ...]`` (rotary cos/sin, position ids) keep that position (``[B, copies, ...]``). ``b``
    is the batch or 1 (broadcast).
    """
    if isinstance(value, tuple):
        return tuple(_select(v, index, positions, length, copies) for v in value)
    if isinstance(value, list):
        return [_select(v, index, positions, length, copies) for v in value]
    if isinstance(value, dict):
        return {k: _select(v, index, positions, length, copies) for k, v in value.items()}
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return value
    rows = index if value.shape[0] > 1 else torch.zeros_like(index)
    if value.dim() == 4 and value.shape[-2] == length and value.shape[-1] == length:
        picked = value[rows, :, positions][:, :, None, :]
        return picked.expand(-1, -1, copies, -1)
    if value.shape[1] == length:
        picked = value[rows, positions][:, None]
        return picked.expand(-1, copies, *picked.shape[2:])
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

    With ``only_positions`` the block computes just the query at ``positions``: since keys and
    values are held at their clean values, the other queries cannot change, and this is about T
    times cheaper. ``on_layer`` then gets one query row per row, ``[rows, H, 1, T]``. The S copies
    of a row run as S queries of that one row, so its keys and values are never repeated. Inputs
    kept at one position per row (``inputs.at``) replay only those positions.

    The block ends once its attention weights are delivered: its output projection, MLP and
    residual additions never run (nothing of them is read).

    ``delta`` is ``[B, D]``, or ``[S, B, D]`` for S alternative changes run side by side as
    S copies of the batch (row ``s * B + b`` of the weights is copy s of row b). Keys and values
    stay as recorded, so only the queries change. ``on_layer`` receives the block's attention
    weights as in :func:`headscope.capture.run`, with a batch whose rows are the copies.
    """
    rows = inputs.hidden.shape[0]
    copies = 1 if delta is None or delta.dim() == 2 else delta.shape[0]
    device = inputs.hidden.device
    if inputs.at is not None and not (only_positions and torch.equal(inputs.at.cpu(), positions.cpu())):
        raise RunFailure("this block's inputs were kept at one position per row: replay only those positions")
    block = inputs.block if inputs.block is not None else model_blocks(loaded.model)[layer]
    on_device = batch.to(loaded.device)
    if copies > 1:
        tiled = Batch(
            on_device.input_ids.repeat(copies, 1),
            on_device.attention_mask.repeat(copies, 1),
            on_device.special.repeat(copies, 1),
            on_device.example_index.repeat(copies),
            on_device.is_causal,
            list(on_device.meta) * copies,
        )
    else:
        tiled = on_device
    if only_positions:
        # The copies of row b are ``copies`` queries of row b, all at its position: they share its
        # keys and values, so nothing is repeated but the query, and the attention is one product.
        length = inputs.kv[0].shape[-2]
        index = torch.arange(rows, device=device)
        at = positions.to(device)
        hidden = inputs.hidden if inputs.at is not None else inputs.hidden[index, at][:, None]
        hidden = hidden.repeat(1, copies, 1)  # [B, copies, D]
        if delta is not None:
            change = delta.reshape(copies, rows, -1).transpose(0, 1)
            hidden += change.to(device=device, dtype=hidden.dtype)
        args = _select(inputs.args, index, at, length, copies)
        kwargs = _select(inputs.kwargs, index, at, length, copies)
        kv = inputs.kv

        chunks: list[tuple[int, torch.Tensor]] = []

        def collect(_index: int, weights: torch.Tensor, _batch: Batch, q_start: int) -> None:
            chunks.append((q_start, weights))

        callback: LayerCallback = collect
        sink_batch = on_device
    else:
        hidden = inputs.hidden.repeat(copies, 1, 1)
        if delta is not None:
            flat = delta.reshape(copies * rows, -1).to(device=device, dtype=hidden.dtype)
            index = torch.arange(copies * rows, device=device)
            hidden[index, positions.to(device).repeat(copies)] += flat
        args = _tile(inputs.args, rows, copies)
        kwargs = _tile(inputs.kwargs, rows, copies)
        kv = _tile(inputs.kv, rows, copies)
        callback, sink_batch = on_layer, tiled
    with (
        prepared(loaded),
        torch.inference_mode(),
        _sink(callback, sink_batch) as sink,
        contextlib.suppress(_Stop),
    ):
        sink.kv_override = {layer: kv}
        # Only the attention weights are read: the block ends after its attention function.
        sink.halt_after_attention = True
        block(hidden, *args, **kwargs)
    if only_positions:
        # [B, H, copies, K'] in query chunks -> [copies * B, H, 1, K']: row s * B + b is copy s of row b.
        if not chunks:
            raise RunFailure(f"path patching: block {layer}'s attention was not seen in the replay")
        keys = max(w.shape[-1] for _, w in chunks)
        weights = chunks[0][1].new_zeros(rows, chunks[0][1].shape[1], copies, keys)
        for q_start, part in chunks:
            weights[:, :, q_start : q_start + part.shape[2], : part.shape[-1]] = part
        on_layer(layer, weights.permute(2, 0, 1, 3).reshape(copies * rows, -1, 1, keys), tiled, 0)
