"""Batching, the forward pass, and the hand-off of each layer's attention to the detectors.

Two ways to get at the attention weights:

* ``stream`` (default): a custom attention function registered with transformers'
  ``AttentionInterface``. It computes the weights as eager attention does, gives them to the
  detectors at once and returns no weights, so only one layer's maps exist at any time.
* ``eager``: the model's own eager attention with ``output_attentions=True``, for models that
  do not route attention through the interface. All layers' maps are kept until the end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import RunFailure

from . import ledger, rows
from .ablation import AblateHeads, HeadOutputMeans
from .batch import Batch, mask_open
from .borrow import borrowed, use_attention
from .dla import HeadWrites, attention_layers
from .edits import applied
from .hooks import hooked
from .kvmask import StreamHeads
from .logits import next_token_losses
from .reads import (
    Attention,
    BlockRecorder,
    FinalHidden,
    LayerCallback,
    LayerDone,
    PairCallback,
    TokenLosses,
)
from .rows import Reads
from .sources import SourceWrites
from .spec import Pass

STREAM_IMPLEMENTATION = "headscope_stream"


_CHUNK_ELEMENTS = 1 << 23  # score elements per query chunk (32 MB in float32)
# (query, key) pairs per fused SDPA call: the kernel never materializes them; this bounds the mask slice.
_FUSED_CHUNK_ELEMENTS = 1 << 26
_PLAN_ROWS = 2048  # mask rows read at a time when planning the key ranges of the chunks


# LayerCallback, PairCallback and LayerDone (what an Attention read calls) live in reads.py.


class _LayerSink:
    """Receives each layer's weights, chunk by chunk, during one forward pass; applies any ablation."""

    def __init__(
        self,
        callback: LayerCallback | None,
        batch: Batch,
        ablation: AblateHeads | None = None,
        on_layer_done: LayerDone | None = None,
        recorder: HeadOutputMeans | None = None,
        streaming: StreamHeads | None = None,
        reads: Reads | None = None,
        on_pairs: PairCallback | None = None,
    ) -> None:
        self.callback = callback
        self.on_pairs = on_pairs
        # The rows the callback reads (None: every row); no callback reads none.
        self.reads: Reads = rows.no_row if callback is None else (reads or rows.every_row)
        self._read: Any = False  # what the readers read in this batch (False: not asked yet)
        self.lse_failed = False  # the fused kernel with log-sum-exp raised: pairs via rows
        self._spans: list[tuple[int, int]] | None | bool = False  # False: not computed yet
        self.counts = rows.active_counts()
        # What this pass reads from each mask, once per mask (layers sharing a mask share it):
        # keys tagged "plan" (_plan's key ranges), "causal" (_causal_chunks' flags), "causal-rows"
        # (_causal_rows' split) and "seen" (_keys_seen's counts).
        self.mask_reads: dict[tuple[Any, ...], Any] = {}
        self.streaming = streaming
        self.batch = batch
        self.ablation = ablation
        self.on_layer_done = on_layer_done
        self.recorder = recorder
        self.calls = 0
        # Path patching: record some layers' keys and values, or replace them by recorded ones;
        # a replay that wants only the attention weights ends its block after the attention.
        self.record_kv: set[int] = set()
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.kv_override: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.halt_after_attention = False

    def begin(self, module: Any) -> int:
        layer = getattr(module, "layer_idx", None)
        if layer is None:  # models that do not number their attention modules run them in order
            layer = self.calls
        self.calls += 1
        return int(layer)

    def deliver(self, layer: int, weights: torch.Tensor, q_start: int) -> None:
        if self.callback is not None:
            self.callback(layer, weights, self.batch, q_start)

    def _selection(self) -> Any:
        if self._read is False:
            self._read = self.reads(self.batch) if rows.selective() else None
        return self._read

    def read_pairs(self) -> rows.Pairs | None:
        """The pairs the readers read, when all of them read pairs and someone takes pair weights."""
        found = self._selection()
        return found if isinstance(found, rows.Pairs) and self.on_pairs is not None else None

    def read_spans(self, layer: int, length: int) -> list[tuple[int, int]] | None:
        """The query spans whose weights are read, in this batch (None: every row, exact)."""
        if self._spans is False:
            found = self._selection()
            if isinstance(found, rows.Pairs):
                found = found.query_mask(self.batch)
            self._spans = None if found is None else rows.spans(found)
        spans = self._spans
        if spans is None or (len(spans) == 1 and spans[0] == (0, length)):
            return None
        return [(a, min(b, length)) for a, b in spans if a < length]  # type: ignore[union-attr]

    def end(self, layer: int) -> None:
        if self.on_layer_done is not None:
            self.on_layer_done(layer, self.batch)


_ACTIVE_SINK: ContextVar[_LayerSink | None] = ContextVar("headscope_sink", default=None)


def _repeat_kv(states: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return states
    batch, kv_heads, length, dim = states.shape
    return (
        states[:, :, None]
        .expand(batch, kv_heads, n_rep, length, dim)
        .reshape(batch, kv_heads * n_rep, length, dim)
    )


def streaming_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Eager attention that hands its weights to the active sink instead of returning them.

    The weights are computed in float32 whatever the model's dtype, so scores do not depend on it.
    Only the query rows the sink's readers declared (:class:`~headscope.capture.rows.Reads`) get
    exact weights; every other row runs through the fused SDPA kernel, with the same mask (see
    :func:`_fused_span`).
    """
    # GPT-OSS's attention sinks: one learned logit per head joins every query's softmax as an extra
    # key that holds no value; the maps handed on are the real keys' weights (they sum to < 1).
    sinks = kwargs.get("s_aux")
    if attention_mask is None and getattr(module, "is_causal", False) and query.shape[2] > 1:
        # Without a mask these weights would let every token attend to the future. transformers
        # builds one through the registered mask function; if it ever does not, stop here.
        raise RunFailure(
            f"{type(module).__name__} is causal but its attention got no mask; streaming capture "
            "will not attend to the future",
            hint="use --capture eager",
        )
    sink = _ACTIVE_SINK.get()
    layer = sink.begin(module) if sink is not None else -1  # a layer index exactly when a sink listens
    if sink is not None:
        if layer in sink.record_kv:
            sink.kv[layer] = (key, value)
        if layer in sink.kv_override:
            key, value = sink.kv_override[layer]
    n_kv_heads = key.shape[1]
    n_rep = query.shape[1] // n_kv_heads
    key = _repeat_kv(key, n_rep)
    value = _repeat_kv(value, n_rep)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    batch, heads, length, _ = query.shape
    keys = key.shape[-2]
    output = torch.empty(batch, heads, length, value.shape[-1], dtype=value.dtype, device=value.device)
    attention = _Layer(
        module, layer, sink, query, key, value, attention_mask, scaling, softcap, sinks, n_kv_heads
    )
    pairs = sink.read_pairs() if sink is not None else None
    if pairs is not None and attention.pairs(output, pairs):
        return _finish(sink, layer, output)
    read = sink.read_spans(layer, length) if sink is not None else None
    exact = [(0, length)] if read is None else read
    # The weights are produced, scored and multiplied into the values one query chunk at a time,
    # so no layer's full [B, H, T, T] map ever exists. In a causal layer the chunk of queries
    # q_start..stop-1 sees only keys < stop: the keys after it are skipped, which halves the work.
    chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * keys))
    plan = _plan(attention_mask, exact, chunk, keys, sink)
    for (start, stop, first, limit), causal in zip(
        plan, _causal_chunks(attention_mask, plan, sink), strict=True
    ):
        attention.exact(output, start, stop, first, limit, deliver=True, causal=causal)
    if read is not None:
        rest = rows.complement(read, length)
        streams = sink is not None and sink.streaming is not None and bool(sink.streaming.kv_heads.get(layer))
        if softcap is not None or sinks is not None or streams:
            # SDPA has neither a logit soft-cap nor a sink column: these rows are computed exactly
            # (the same numbers as a full-map pass), only not handed on. So are a layer's rows when
            # some of its KV heads stream: a mask per head sends SDPA to its slow unfused path.
            plan = _plan(attention_mask, rest, chunk, keys, sink)
            for (start, stop, first, limit), causal in zip(
                plan, _causal_chunks(attention_mask, plan, sink), strict=True
            ):
                attention.exact(output, start, stop, first, limit, deliver=False, causal=causal)
        else:
            fused = max(1, _FUSED_CHUNK_ELEMENTS // max(1, batch * heads * keys))
            plan = _plan(attention_mask, rest, fused, keys, sink)
            for (start, stop, first, limit), causal in zip(
                plan, _causal_chunks(attention_mask, plan, sink), strict=True
            ):
                attention.fused(output, start, stop, first, limit, causal=causal)
    return _finish(sink, layer, output)


def _finish(sink: _LayerSink | None, layer: int, output: torch.Tensor) -> tuple[torch.Tensor, None]:
    """The layer's end for the sink (recorder, ablation), and the output in the model's layout."""
    if sink is not None:
        sink.end(layer)
        if sink.halt_after_attention:
            raise _Stop  # the weights are delivered: nothing after them is read
        if sink.recorder is not None:
            sink.recorder.add(layer, output, sink.batch)
        if sink.ablation is not None:
            output = sink.ablation.apply(layer, output, sink.batch)
    return output.transpose(1, 2).contiguous(), None


@dataclass
class _Layer:
    """One attention call's tensors, and the two ways to compute a span of its query rows."""

    module: Any
    layer: int
    sink: _LayerSink | None
    query: torch.Tensor  # [B, H, T, d]
    key: torch.Tensor  # [B, H, K, d] (KV heads repeated)
    value: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    softcap: float | None
    sinks: torch.Tensor | None
    n_kv_heads: int

    def _rows(self, start: int, stop: int) -> torch.Tensor | None:
        mask = self.mask
        if mask is None:
            return None
        return mask if mask.shape[2] == 1 else mask[:, :, start:stop]

    def _blocked(self, start: int, stop: int, first: int, limit: int) -> torch.Tensor | None:
        sink = self.sink
        if sink is None or sink.streaming is None:
            return None
        heads = self.query.shape[1]
        return sink.streaming.blocked(
            self.layer, sink.batch, heads, self.n_kv_heads, start, stop, first, limit
        )

    def exact(
        self,
        output: torch.Tensor,
        start: int,
        stop: int,
        first: int,
        limit: int,
        *,
        deliver: bool,
        causal: bool = False,
    ) -> None:
        """Rows start..stop-1 with float32 weights, handed to the sink when ``deliver``. A
        ``causal`` chunk (:func:`_causal_chunks`) masks only its diagonal block: the rest is open."""
        rows_mask = self._rows(start, stop)
        scores = torch.matmul(
            self.query[:, :, start:stop] * self.scaling, self.key[:, :, first:limit].transpose(2, 3)
        )
        if self.softcap is not None:
            scores = torch.tanh(scores.div_(self.softcap)).mul_(self.softcap)
        if causal:
            size = stop - start
            upper = torch.ones(size, size, dtype=torch.bool, device=scores.device).triu_(1)
            scores[..., start - first :].masked_fill_(upper, torch.finfo(scores.dtype).min)
        elif rows_mask is not None:
            if rows_mask.dtype == torch.bool:  # True = may attend
                scores.masked_fill_(~rows_mask[..., first:limit], torch.finfo(scores.dtype).min)
            else:
                scores.add_(rows_mask[..., first:limit])
        blocked = self._blocked(start, stop, first, limit)
        if blocked is not None:
            scores.masked_fill_(blocked, torch.finfo(scores.dtype).min)
        if self.sinks is not None:
            column = self.sinks.reshape(1, -1, 1, 1).to(scores.dtype).expand(*scores.shape[:-1], 1)
            weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1, dtype=torch.float32)
            weights = weights[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
        del scores
        output[:, :, start:stop] = torch.matmul(weights.to(self.value.dtype), self.value[:, :, first:limit])
        sink = self.sink
        if sink is not None:
            sink.counts.exact(self.layer, stop - start)
        if deliver and sink is not None:
            if first > 0:  # detectors index keys from 0: the keys before the window get weight 0
                full = weights.new_zeros(*weights.shape[:-1], limit)
                full[..., first:] = weights
                weights = full
            sink.batch.set_chunk(start, stop, mask=rows_mask[..., :limit] if rows_mask is not None else None)
            sink.deliver(self.layer, weights, start)

    def pairs(self, output: torch.Tensor, pairs: rows.Pairs) -> bool:
        """Every row fused, with its log-sum-exp; then each declared pair's weight from it.

        False (nothing written) where this cannot be exact: a soft-cap or sink column (the kernel
        has neither), streaming heads in this layer, or a device without a fused kernel that
        returns the log-sum-exp; the caller then computes the pairs' rows exactly."""
        sink = self.sink
        assert sink is not None
        if self.softcap is not None or self.sinks is not None:
            return False
        if sink.streaming is not None and sink.streaming.kv_heads.get(self.layer):
            return False
        if sink.lse_failed or not _lse_kernel_ok(self.query, self.value):
            return False
        batch, heads, length, _ = self.query.shape
        keys = self.key.shape[-2]
        lse = torch.empty(batch, heads, length, dtype=torch.float32, device=self.query.device)
        chunk = max(1, _FUSED_CHUNK_ELEMENTS // max(1, batch * heads * keys))
        try:
            plan = _plan(self.mask, [(0, length)], chunk, keys, sink)
            for (start, stop, first, limit), causal in zip(
                plan, _causal_chunks(self.mask, plan, sink), strict=True
            ):
                self.fused(output, start, stop, first, limit, lse=lse, causal=causal)
        except (RuntimeError, NotImplementedError):
            sink.lse_failed = True  # a kernel this build lacks for these shapes: rows, exactly
            return False
        seen = _keys_seen(self.mask, sink, batch, length)  # [B, T]
        found = []
        for rows_, queries, key_ids in pairs.parts:
            scores = (self.query[rows_, :, queries].float() * self.key[rows_, :, key_ids].float()).sum(-1)
            weights = torch.exp(scores * self.scaling - lse[rows_, :, queries])  # [n, H]
            visible = _visible_at(self.mask, rows_, queries, key_ids)
            weights = torch.where(visible[:, None], weights, torch.zeros((), dtype=weights.dtype))
            found.append(rows.PairWeights(weights, visible, seen[rows_, queries]))
            sink.counts.paired(self.layer, len(rows_))
        assert sink.on_pairs is not None
        sink.on_pairs(self.layer, found, sink.batch)
        return True

    def fused(
        self,
        output: torch.Tensor,
        start: int,
        stop: int,
        first: int,
        limit: int,
        lse: torch.Tensor | None = None,
        causal: bool = False,
    ) -> None:
        """Rows start..stop-1 through ``scaled_dot_product_attention``: no weights exist.

        The same keys (first..limit-1), the same mask slice and the same streaming-head blocks as
        :meth:`exact`, and the same output for a row with no visible key. ``lse`` (``[B, H, T]``)
        receives each row's log-sum-exp. A ``causal`` chunk on the CPU needs no mask: the keys
        before it and its diagonal block (causal) go through the fused kernel separately, and the
        two are merged by their log-sum-exps (as flash-decoding merges splits).
        """
        blocked = self._blocked(start, stop, first, limit)
        fast = blocked is None and self.query.device.type == "cpu" and _lse_kernel_ok(self.query, self.value)
        split = rest = None
        if fast and not causal:
            # A batch with a shorter (padded) window: its rows past their end are not causal, so
            # the chunk is not, and the masked kernel would take every row (on the CPU several
            # times slower than the causal split, and quadratic in the chunk's keys). The rows
            # whose mask is causal over this chunk go through the causal split; only the others
            # keep the mask.
            split, rest = _causal_rows(self.mask, start, stop, first, limit, self.sink)
        if (causal and fast) or split is not None:
            which = slice(None) if split is None else split
            out, found = _causal_split(
                self.query[which, :, start:stop],
                self.key[which, :, first:limit],
                self.value[which, :, first:limit],
                start - first,
                self.scaling,
            )
            if lse is not None:
                lse[which, :, start:stop] = found
            output[which, :, start:stop] = out
            if split is None:
                if self.sink is not None:
                    self.sink.counts.fused(self.layer, stop - start)
                return
            self._masked(output, start, stop, first, limit, lse, blocked, rest)
            return
        self._masked(output, start, stop, first, limit, lse, blocked, None)

    def _masked(
        self,
        output: torch.Tensor,
        start: int,
        stop: int,
        first: int,
        limit: int,
        lse: torch.Tensor | None,
        blocked: torch.Tensor | None,
        batch_rows: torch.Tensor | None,
    ) -> None:
        """Rows start..stop-1 through the masked fused kernel (``batch_rows``: only these rows of
        the batch; None: all)."""
        rows_mask = self._rows(start, stop)
        pick = slice(None) if batch_rows is None else batch_rows
        if rows_mask is not None and batch_rows is not None and rows_mask.shape[0] > 1:
            rows_mask = rows_mask[batch_rows]
        if blocked is not None and batch_rows is not None and blocked.dim() == 4 and blocked.shape[0] > 1:
            blocked = blocked[batch_rows]
        allowed = None
        if rows_mask is not None:
            allowed = rows_mask[..., first:limit]
        if blocked is not None:
            if allowed is None:
                allowed = ~blocked
            elif allowed.dtype == torch.bool:
                allowed = allowed & ~blocked
            else:
                allowed = allowed.masked_fill(blocked, torch.finfo(allowed.dtype).min)
        if allowed is not None and allowed.dtype != torch.bool:
            allowed = allowed.to(self.query.dtype)
        query = self.query[pick, :, start:stop]
        key, value = self.key[pick, :, first:limit], self.value[pick, :, first:limit]
        if lse is None:
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=allowed, scale=self.scaling
            )
        else:
            out, found = _fused_with_lse(query, key, value, allowed, self.scaling)
            lse[pick, :, start:stop] = found
        if allowed is not None:
            # A row that sees no key (padding past a sliding window) gets what the exact path
            # gives it, the mean of the values (a softmax over equal logits), not SDPA's 0 or NaN.
            dead = ~mask_open(allowed).any(-1, keepdim=True)  # [B, 1 or H, c, 1]
            mean = value.mean(-2, keepdim=True)
            out = torch.where(dead, mean.to(out.dtype), torch.nan_to_num_(out, nan=0.0))
        output[pick, :, start:stop] = out
        if self.sink is not None:
            self.sink.counts.fused(self.layer, stop - start)


def _lse_kernel_ok(query: torch.Tensor, value: torch.Tensor) -> bool:
    """A fused kernel that returns the log-sum-exp exists here: CPU or CUDA, and values as wide as
    queries (multi-head latent attention's are not)."""
    return query.device.type in ("cpu", "cuda") and query.shape[-1] == value.shape[-1]


def _fused_with_lse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused attention that also returns each query row's log-sum-exp ``[B, H, c]`` (float32).

    The kernels that return it take an additive mask of the query's dtype, not a boolean one."""
    bias = None
    if allowed is not None:
        bias = allowed
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill_(
                ~allowed, float("-inf")
            )
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=bias, scale=scale
        )
    else:
        out, lse, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, True, 0.0, False, scale=scale
        )
        lse = lse[..., : query.shape[2]]
    return out, lse.float()


def _causal_rows(
    mask: torch.Tensor | None, start: int, stop: int, first: int, limit: int, sink: _LayerSink | None
) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """The batch rows (indices) whose mask lets every query of start..stop-1 (every head) see
    exactly the keys first..q, and the other rows, where some rows do and some do not (a padded
    window's rows past its end); (None, None) where none does, or the mask has no row per batch
    row. Read from the mask, once per mask and chunk."""
    if mask is None or mask.shape[2] == 1 or mask.shape[0] == 1 or limit != stop or first > start:
        return None, None
    memo = sink.mask_reads if sink is not None else {}
    ident = ("causal-rows", mask.data_ptr(), tuple(mask.shape), mask.dtype, start, stop, first, limit)
    if ident not in memo:
        block = mask_open(mask[:, :, start:stop, first:limit])  # [B, h, c, K']
        before = block[..., : start - first].flatten(1).all(1)
        size = stop - start
        tri = torch.ones(size, size, dtype=torch.bool, device=mask.device).tril_()
        diag = (block[..., start - first :] == tri).flatten(1).all(1)
        flags = before & diag
        found, rest = torch.nonzero(flags).flatten(), torch.nonzero(~flags).flatten()
        memo[ident] = (found, rest) if len(found) and len(rest) else (None, None)
    return memo[ident]


def _causal_split(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, before: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a causal chunk whose queries see every one of the first ``before`` keys and the
    causal triangle of the rest: two unmasked fused calls, merged by their log-sum-exps."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    diag_out, diag_lse = flash(query, key[:, :, before:], value[:, :, before:], 0.0, True, scale=scale)
    if before == 0:
        return diag_out, diag_lse.float()
    past_out, past_lse = flash(query, key[:, :, :before], value[:, :, :before], 0.0, False, scale=scale)
    past_lse, diag_lse = past_lse.float(), diag_lse.float()
    lse = torch.logaddexp(past_lse, diag_lse)
    past = torch.exp(past_lse - lse)[..., None].to(past_out.dtype)
    diag = torch.exp(diag_lse - lse)[..., None].to(diag_out.dtype)
    return past_out * past + diag_out * diag, lse


def _keys_seen(mask: torch.Tensor | None, sink: _LayerSink, batch: int, length: int) -> torch.Tensor:
    """[B, T] how many keys the mask lets each query see (at least 1), once per mask and batch."""
    if mask is None:
        seen = sink.batch.attention_mask.sum(1, keepdim=True).expand(batch, length)
        return seen.to(torch.float32).clamp(min=1.0)
    ident = ("seen", mask.data_ptr(), tuple(mask.shape), mask.dtype)
    if ident not in sink.mask_reads:
        n_rows = mask.shape[2]
        out = torch.empty(batch, n_rows, dtype=torch.float32, device=mask.device)
        for a in range(0, n_rows, _PLAN_ROWS):
            b = min(n_rows, a + _PLAN_ROWS)
            open_ = mask_open(mask[:, :, a:b])
            open_ = open_.any(1) if open_.shape[1] > 1 else open_[:, 0]
            out[:, a:b] = open_.sum(-1).to(torch.float32)
        sink.mask_reads[ident] = (
            out.expand(batch, length).clamp(min=1.0) if n_rows == 1 else out.clamp(min=1.0)
        )
    seen: torch.Tensor = sink.mask_reads[ident]
    return seen


def _visible_at(
    mask: torch.Tensor | None, rows_: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """[n] whether the mask lets each (row, query) see its key (any head, as the dense path reads it)."""
    if mask is None:
        return torch.ones(len(rows_), dtype=torch.bool, device=rows_.device)
    at = queries if mask.shape[2] > 1 else torch.zeros_like(queries)
    return mask_open(mask[rows_, :, at, keys]).any(-1)


def _plan(
    mask: torch.Tensor | None,
    spans: list[tuple[int, int]],
    chunk: int,
    keys: int,
    sink: _LayerSink | None,
) -> list[tuple[int, int, int, int]]:
    """(start, stop, first, limit) for each query chunk of ``spans``: the keys first..limit-1 are
    the only ones any query of the chunk may see under the mask (read from it, never assumed).

    A sliding window hides the keys before ``first`` from every query of a late chunk; in a causal
    layer the keys from ``stop`` on are hidden from the whole chunk (a padding-only or prefix-LM
    mask hides none, so ``limit`` is then every key). Computed for all chunks at once, with one
    read of the result to the host per mask (layers sharing a mask share it), not one per chunk.
    """
    chunks = [(s, min(stop, s + chunk)) for start, stop in spans for s in range(start, stop, chunk)]
    if not chunks:
        return []
    if mask is None or mask.shape[2] == 1:
        return [(s, e, 0, keys) for s, e in chunks]
    memo = sink.mask_reads if sink is not None else {}
    ident = ("plan", mask.data_ptr(), tuple(mask.shape), mask.dtype, tuple(chunks), keys)
    if ident not in memo:
        length = mask.shape[2]
        first_key = torch.empty(length, dtype=torch.long, device=mask.device)
        last_key = torch.empty(length, dtype=torch.long, device=mask.device)
        for a in range(0, length, _PLAN_ROWS):  # [rows, K] at a time: never a [T, K] copy
            b = min(length, a + _PLAN_ROWS)
            open_ = mask_open(mask[:, :, a:b]).flatten(0, 1).any(0).to(torch.int8)
            seen = open_.any(-1)
            first_key[a:b] = torch.where(seen, open_.argmax(-1), keys)
            last_key[a:b] = torch.where(seen, keys - 1 - open_.flip(-1).argmax(-1), -1)
        starts = torch.tensor([s for s, _ in chunks], device=mask.device)
        stops = torch.tensor([e for _, e in chunks], device=mask.device)
        index = torch.arange(length, device=mask.device)
        inside = (index[None, :] >= starts[:, None]) & (index[None, :] < stops[:, None])  # [C, T]
        firsts = torch.where(inside, first_key[None, :], keys).amin(-1)
        lasts = torch.where(inside, last_key[None, :], -1).amax(-1)
        memo[ident] = list(zip(firsts.tolist(), lasts.tolist(), strict=True))
    plan = []
    for (s, e), (first, last) in zip(chunks, memo[ident], strict=True):
        limit = keys if last >= e else min(e, keys)
        first = 0 if first >= keys else min(first, limit)
        plan.append((s, e, first, limit))
    return plan


def _causal_chunks(
    mask: torch.Tensor | None, plan: list[tuple[int, int, int, int]], sink: _LayerSink | None
) -> list[bool]:
    """For each chunk of ``plan``: does the mask let every query of it (every row and head) see
    exactly the keys first..q, i.e. all keys before the chunk and the causal triangle within it?
    Then the chunk needs no mask: the keys before it, unmasked, and the diagonal block, causal.
    Read from the mask once per mask and chunking (one copy to the host), never assumed."""
    if mask is None or mask.shape[2] == 1 or not plan:
        return [False] * len(plan)
    memo = sink.mask_reads if sink is not None else {}
    ident = ("causal", mask.data_ptr(), tuple(mask.shape), mask.dtype, tuple(plan))
    if ident not in memo:
        flags = []
        for start, stop, first, limit in plan:
            if limit != stop or first > start:
                flags.append(torch.zeros((), dtype=torch.bool, device=mask.device))
                continue
            block = mask_open(mask[:, :, start:stop, first:limit])
            before = block[..., : start - first].all()
            size = stop - start
            tri = torch.ones(size, size, dtype=torch.bool, device=mask.device).tril_()
            flags.append(before & (block[..., start - first :] == tri).all())
        memo[ident] = torch.stack(flags).tolist()
    flags_: list[bool] = memo[ident]
    return flags_


_registered = False


def boolean_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """The layer's mask as booleans (True = may attend), always built, never skipped.

    transformers' eager mask is the same mask turned into float32 additive biases: 4 bytes per
    (query, key) against 1, so 256 MB per mask type at 8k tokens instead of 64 MB. Building it
    always (no "causal, so skip it") keeps the guarantee that a causal layer is never unmasked.
    """
    from transformers.masking_utils import sdpa_mask

    for key in ("allow_is_causal_skip", "allow_is_bidirectional_skip", "dtype"):
        kwargs.pop(key, None)
    return sdpa_mask(*args, allow_is_causal_skip=False, allow_is_bidirectional_skip=False, **kwargs)


def register_streaming_attention() -> None:
    """Register the streaming function (and a boolean mask) under STREAM_IMPLEMENTATION."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(STREAM_IMPLEMENTATION, streaming_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(STREAM_IMPLEMENTATION, boolean_mask)
    _registered = True


# Borrows of a model in streaming capture switch it to this module's attention function.
use_attention("stream", STREAM_IMPLEMENTATION, register_streaming_attention)


@contextlib.contextmanager
def _sink(
    callback: LayerCallback | None,
    batch: Batch,
    ablation: AblateHeads | None = None,
    on_layer_done: LayerDone | None = None,
    recorder: HeadOutputMeans | None = None,
    streaming: StreamHeads | None = None,
    reads: Reads | None = None,
    on_pairs: PairCallback | None = None,
) -> Iterator[_LayerSink]:
    sink = _LayerSink(callback, batch, ablation, on_layer_done, recorder, streaming, reads, on_pairs)
    token = _ACTIVE_SINK.set(sink)
    try:
        yield sink
    finally:
        _ACTIVE_SINK.reset(token)


def model_inputs(loaded: Any, batch: Batch) -> dict[str, Any]:
    """A forward pass's keyword arguments for an on-device batch: the ids, the padding mask, and
    no KV cache for a causal LM (nothing is generated)."""
    inputs: dict[str, Any] = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask.long()}
    if loaded.is_causal:
        inputs["use_cache"] = False
    return inputs


class _Stop(Exception):
    """Raised before the first block a pass does not need (caught by :func:`stopping_after`), or
    after the attention of a replayed block (:func:`headscope.capture.patching.rerun_block`)."""


@contextlib.contextmanager
def stopping_after(loaded: Any, last: int | None) -> Iterator[Callable[[Any, dict[str, Any]], Any]]:
    """``call(module, inputs)`` runs ``module(**inputs)``, ending the pass before block ``last + 1``
    (None: the whole pass; the result is then None)."""
    from headscope.models.anatomy import blocks

    stages = blocks(loaded.model) if last is not None else []

    def stop(*_: Any) -> None:
        raise _Stop

    def call(module: Any, inputs: dict[str, Any]) -> Any:
        try:
            return module(**inputs)
        except _Stop:
            return None

    with hooked() as hooks:
        if last is not None and last + 1 < len(stages):
            hooks.before(stages[last + 1], stop)
        yield call


def block_outputs(
    loaded: Any, batches: Iterable[Batch], layer: int, on_output: Callable[[torch.Tensor, Batch], None]
) -> None:
    """``on_output(hidden, batch)`` gets each batch's residual stream after block ``layer``
    (``[B, T, D]``, what the block returned), and the pass ends there: nothing after the block runs."""
    from headscope.models.anatomy import blocks

    block = blocks(loaded.model)[layer]
    caught: dict[str, torch.Tensor] = {}

    def catch(_module: Any, _args: Any, output: Any) -> None:
        caught["hidden"] = (output[0] if isinstance(output, tuple) else output).detach()
        raise _Stop

    with hooked() as hooks:
        hooks.after(block, catch)
        for batch in batches:
            on_device = batch.to(loaded.device)
            inputs = model_inputs(loaded, on_device)
            with (
                borrowed(loaded),
                torch.inference_mode(),
                _sink(None, on_device),
                contextlib.suppress(_Stop),
            ):
                loaded.base(**inputs)
            if "hidden" not in caught:
                raise RunFailure(f"block {layer} never ran; cannot read the residual stream after it")
            on_output(caught.pop("hidden"), on_device)


def run(loaded: Any, batches: Iterable[Batch], spec: Pass) -> None:
    """Run every batch through the model, as ``spec`` declares: what the pass reads, what it edits.

    The reads (:mod:`headscope.capture.reads`) get what they declare, batch by batch: each layer's
    attention weights (:class:`Attention`, for the rows it selects), next-token losses
    (:class:`TokenLosses`: only then does the LM head run, in vocabulary slices), the final hidden
    states (:class:`FinalHidden`), heads' writes (:class:`HeadWrites`; its ``begin`` and ``finish``
    run around each batch), heads' mean outputs (:class:`HeadOutputMeans`) and blocks' inputs
    (:class:`BlockRecorder`). The edits (:mod:`headscope.capture.edits`) change the model for the
    pass only. ``spec.on_batch_done(batch)`` runs once every read of the batch is complete.
    Everything is checked before the first forward pass (:meth:`Pass.check`, :func:`applied`).
    """
    if not isinstance(spec, Pass):
        raise TypeError(
            f"capture.run takes a Pass, got {type(spec).__name__}: "
            "capture.run(loaded, batches, Pass(reads=[...], edits=[...]))"
        )
    spec.check(loaded)
    attention = spec.read(Attention) or Attention()
    on_layer, on_layer_done = attention.on_layer, attention.on_layer_done
    losses = spec.read(TokenLosses)
    final = spec.read(FinalHidden)
    writes = spec.read(HeadWrites)
    recorder = spec.read(HeadOutputMeans)
    blocks = spec.read(BlockRecorder)
    sources = spec.read(SourceWrites)
    stop_after = spec.stop_after
    on_batch_done = spec.on_batch_done
    device = loaded.device
    module = loaded.base
    layers = attention_layers(loaded)
    if stop_after is not None:
        layers = [layer for layer in layers if layer <= stop_after]
    n_layers = len(layers)
    book = ledger.active()
    share = n_layers / max(1, len(attention_layers(loaded)))
    with (
        borrowed(loaded),
        torch.inference_mode(),
        stopping_after(loaded, stop_after) as stopped,
        applied(loaded, spec.edits) as live,
    ):
        for batch in batches:
            on_device = batch.to(device)
            live.batch = on_device
            inputs = model_inputs(loaded, on_device)
            if book is not None:
                book.note(*on_device.input_ids.shape, share, head=losses is not None)
            if writes is not None:
                writes.begin(on_device)
            if blocks is not None:
                blocks.begin(on_device)
            if sources is not None:
                sources.begin(on_device)
            with (
                writes.hooked() if writes is not None else contextlib.nullcontext(),
                blocks.hooked() if blocks is not None else contextlib.nullcontext(),
                sources.hooked() if sources is not None else contextlib.nullcontext(),
            ):
                if loaded.capture_mode == "stream":
                    with _sink(
                        on_layer,
                        on_device,
                        live.ablation,
                        on_layer_done,
                        recorder,
                        live.streaming,
                        attention.rows,
                        attention.on_pairs,
                    ) as sink:
                        if blocks is not None:
                            sink.record_kv = set(blocks.layers)
                        out = stopped(module, inputs)
                    if blocks is not None:
                        blocks.finish(sink.kv)
                    if sink.calls != n_layers:
                        raise RunFailure(
                            f"expected attention from {n_layers} layers, captured {sink.calls}",
                            hint="this architecture may need --capture eager",
                        )
                else:
                    out = module(**inputs, output_attentions=True)
                    attentions = [a for a in (out.attentions or ()) if a is not None]
                    if len(attentions) != n_layers:
                        raise RunFailure("the model returned no attention weights in eager mode")
                    for layer, weights in zip(layers, attentions, strict=True):
                        if on_layer is not None:
                            # No mask reaches us here: a key is visible when some head gives it
                            # weight (a masked key gets exactly 0 in every head).
                            length = weights.shape[2]
                            on_device.set_chunk(0, length, visible=(weights > 0).any(1))
                            on_layer(layer, weights.float(), on_device, 0)
                        if on_layer_done is not None:
                            on_layer_done(layer, on_device)
            if writes is not None:
                writes.finish()
            if sources is not None:
                sources.finish()
            if final is not None:
                final.on_hidden(out.last_hidden_state, on_device)
            if losses is not None:
                losses.on_losses(
                    next_token_losses(loaded, out.last_hidden_state, on_device.input_ids), on_device
                )
            if on_batch_done is not None:
                on_batch_done(batch)


def head_output_means(
    loaded: Any, batches: Iterable[Batch], heads: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], torch.Tensor]:
    """The calibration pass of mean ablation: each head's mean output at each position, over the set."""
    recorder = HeadOutputMeans(heads)
    run(loaded, batches, Pass(reads=[recorder]))
    return recorder.result()


# The borrow lives in headscope.capture.borrow; this name stays for the modules that import it from here.
prepared = borrowed
