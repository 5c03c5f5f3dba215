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
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import RunFailure

STREAM_IMPLEMENTATION = "headscope_stream"
_CHUNK_ELEMENTS = 1 << 23  # score elements per query chunk (32 MB in float32)

# on_layer(layer, weights[B, H, c, K'], batch, q_start): weights of queries q_start..q_start+c-1.
LayerCallback = Callable[[int, torch.Tensor, "Batch", int], None]
LayerDone = Callable[[int, "Batch"], None]


@dataclass
class Batch:
    """Padded token ids plus what detectors need to know about each row.

    ``special`` marks BOS/CLS/SEP and other special tokens; ``attention_mask`` marks real
    (non-pad) positions. ``example_index`` maps each row to its example in the prompt set,
    so that scores can be kept per example and bootstrapped.
    """

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] bool
    special: torch.Tensor  # [B, T] bool
    example_index: torch.Tensor  # [B] long
    is_causal: bool
    meta: list[dict[str, Any]] = field(default_factory=list)
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _chunk: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def content(self) -> torch.Tensor:
        """Positions holding a real, non-special token."""
        return self.attention_mask & ~self.special

    def set_chunk(
        self,
        q_start: int,
        stop: int,
        mask: torch.Tensor | None = None,
        visible: torch.Tensor | None = None,
    ) -> None:
        """Record which keys the current layer's mask leaves visible to queries ``q_start..stop-1``.

        The capture calls this before handing a chunk to the detectors: with the chunk of the
        layer's own mask (``mask``, additive or boolean, ``[B, 1 or H, c, K']``), or, where the
        mask is not available (eager capture), with ``visible`` ``[B, c, K']`` read off the weights.
        """
        self._chunk = {"q_start": q_start, "stop": stop, "mask": mask, "visible": visible}

    def visible(self, q_start: int, stop: int, keys: int) -> torch.Tensor:
        """[B, c, keys] True where the current layer's mask lets query q see key k.

        Read from the layer's own mask when the capture recorded it for this chunk, so a
        sliding-window layer past its window, or any other mask, gives the keys it really leaves
        visible. Without a recorded mask (synthetic maps fed to a detector), the keys are the
        real (non-pad) tokens, and in a causal model only those up to the query.
        """
        chunk = getattr(self, "_chunk", None)
        if chunk is not None and chunk["q_start"] == q_start and chunk["stop"] == stop:
            if chunk["visible"] is None:
                mask = chunk["mask"]
                if mask is None:
                    seen = self.attention_mask[:, None, :].expand(-1, stop - q_start, -1)
                else:
                    open_ = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
                    seen = open_.any(1) if open_.shape[1] > 1 else open_[:, 0]
                    seen = seen.expand(self.input_ids.shape[0], stop - q_start, -1)
                chunk["visible"] = seen
            return chunk["visible"][..., :keys]
        seen = self.attention_mask[:, None, :keys].expand(-1, stop - q_start, -1)
        if self.is_causal:
            queries = torch.arange(q_start, stop, device=seen.device)[:, None]
            seen = seen & (torch.arange(keys, device=seen.device)[None, :] <= queries)
        return seen

    def visible_count(self, q_start: int, stop: int, keys: int) -> torch.Tensor:
        """[B, c] how many keys each query may attend to (what uniform attention spreads over)."""
        return self.visible(q_start, stop, keys).sum(-1).to(torch.float32).clamp(min=1.0)

    @property
    def earlier_same_token_pairs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, queries, keys): every key k < query q holding the same content token as q.

        Kept sparse, as coordinates: a [B, T, T] map would be 1 GB per row at 32k tokens, while
        the pairs number about T x (repeats - 1) on the repeated-token protocol.
        """
        if "earlier_same_token_pairs" not in self._cache:
            rows, queries, keys = [], [], []
            content = self.content.cpu()
            ids = self.input_ids.cpu()
            for row in range(ids.shape[0]):
                positions = content[row].nonzero().flatten()
                tokens = ids[row, positions]
                order = torch.sort(tokens, stable=True).indices  # same token: ascending position
                ordered_pos, ordered_tok = positions[order], tokens[order]
                starts = torch.ones_like(ordered_tok, dtype=torch.bool)
                starts[1:] = ordered_tok[1:] != ordered_tok[:-1]
                bounds = [*starts.nonzero().flatten().tolist(), len(ordered_tok)]
                for first, last in zip(bounds[:-1], bounds[1:], strict=True):
                    if last - first < 2:
                        continue
                    group = ordered_pos[first:last]
                    later, earlier = torch.tril_indices(len(group), len(group), offset=-1)
                    rows.append(torch.full((len(later),), row, dtype=torch.long))
                    queries.append(group[later])
                    keys.append(group[earlier])
            device = self.input_ids.device
            empty = torch.zeros(0, dtype=torch.long)
            self._cache["earlier_same_token_pairs"] = tuple(
                (torch.cat(part) if part else empty).to(device) for part in (rows, queries, keys)
            )
        return self._cache["earlier_same_token_pairs"]  # type: ignore[return-value]

    @property
    def earlier_same_token(self) -> torch.Tensor:
        """[B, Q, K] dense form of :attr:`earlier_same_token_pairs` (for tests and short inputs)."""
        rows, queries, keys = self.earlier_same_token_pairs
        length = self.input_ids.shape[1]
        dense = torch.zeros(self.input_ids.shape[0], length, length, dtype=torch.bool, device=rows.device)
        dense[rows, queries, keys] = True
        return dense

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.special.to(device),
            self.example_index,
            self.is_causal,
            self.meta,
        )


def make_batches(
    sequences: Sequence[Sequence[int]],
    special_masks: Sequence[Sequence[bool]],
    *,
    batch_size: int,
    pad_id: int,
    is_causal: bool,
    meta: Sequence[dict[str, Any]] | None = None,
    sort_by_length: bool = True,
) -> list[Batch]:
    """Right-pad sequences into batches. Sorting by length keeps padding (wasted work) small."""
    order = list(range(len(sequences)))
    if sort_by_length:
        order.sort(key=lambda i: len(sequences[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        special = torch.zeros((len(rows), width), dtype=torch.bool)
        for r, i in enumerate(rows):
            n = len(sequences[i])
            ids[r, :n] = torch.as_tensor(list(sequences[i]), dtype=torch.long)
            mask[r, :n] = True
            special[r, :n] = torch.as_tensor(list(special_masks[i]), dtype=torch.bool)
        batches.append(
            Batch(
                ids,
                mask,
                special,
                torch.as_tensor(rows, dtype=torch.long),
                is_causal,
                [dict(meta[i]) for i in rows] if meta is not None else [{} for _ in rows],
            )
        )
    return batches


@dataclass(frozen=True)
class Ablation:
    """Heads whose attention output is replaced: by zeros, or by its mean over the whole set.

    The replacement acts on each head's output before the output projection, so it removes
    exactly that head's contribution to the residual stream. Mean ablation replaces the output
    at position t by the head's mean output at position t over every sequence of the data set
    that reaches t, measured in a clean calibration pass (:func:`head_output_means`) before the
    ablated runs. It therefore does not depend on how the set is cut into batches.
    """

    heads: dict[int, tuple[int, ...]]  # layer -> query heads
    mode: str = "zero"  # "zero" or "mean"
    means: dict[tuple[int, int], torch.Tensor] | None = field(default=None, repr=False)  # [T, D]

    def __post_init__(self) -> None:
        if self.mode not in {"zero", "mean"}:
            raise ValueError(f"unknown ablation mode {self.mode!r}")
        if self.mode == "mean":
            missing = [
                (layer, head)
                for layer, heads in self.heads.items()
                for head in heads
                if self.means is None or (layer, head) not in self.means
            ]
            if missing:
                raise ValueError(f"mean ablation needs set-wide means for heads {missing}")

    @classmethod
    def of(
        cls,
        pairs: Iterable[tuple[int, int]],
        mode: str = "zero",
        means: dict[tuple[int, int], torch.Tensor] | None = None,
    ) -> Ablation:
        heads: dict[int, list[int]] = {}
        for layer, head in pairs:
            heads.setdefault(int(layer), []).append(int(head))
        chosen = {layer: tuple(sorted(set(h))) for layer, h in heads.items()}
        kept = None
        if means is not None:
            kept = {
                (layer, h): means[(layer, h)]
                for layer, hs in chosen.items()
                for h in hs
                if (layer, h) in means
            }
        return cls(chosen, mode, kept)

    def apply(self, layer: int, output: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``output`` is [B, H, T, D]; returns it with the ablated heads replaced."""
        heads = self.heads.get(layer)
        if not heads:
            return output
        output = output.clone()
        if self.mode == "zero":
            output[:, torch.tensor(heads, device=output.device)] = 0.0
            return output
        assert self.means is not None  # checked in __post_init__
        length = output.shape[2]
        for head in heads:
            mean = self.means[(layer, head)]
            if mean.shape[0] < length:
                raise RunFailure(
                    f"mean ablation: the calibration pass saw {mean.shape[0]} positions, this batch has {length}"
                )
            output[:, head] = mean[:length].to(device=output.device, dtype=output.dtype)
        return output


class HeadOutputMeans:
    """Running per-position sums of chosen heads' outputs over every real row of a data set."""

    def __init__(self, heads: Iterable[tuple[int, int]]) -> None:
        self.by_layer: dict[int, list[int]] = {}
        for layer, head in sorted(set(heads)):
            self.by_layer.setdefault(int(layer), []).append(int(head))
        self.sums: dict[int, torch.Tensor] = {}  # layer -> [heads, T, D] float64
        self.counts: dict[int, torch.Tensor] = {}  # layer -> [T]

    def add(self, layer: int, output: torch.Tensor, batch: Batch) -> None:
        heads = self.by_layer.get(layer)
        if not heads:
            return
        rows = batch.attention_mask.to(torch.float64)  # [B, T]: padding does not count
        part = torch.einsum("bhtd,bt->htd", output[:, heads].double(), rows).cpu()
        count = rows.sum(0).cpu()
        if layer not in self.sums:
            self.sums[layer], self.counts[layer] = part, count
            return
        grown = max(self.sums[layer].shape[1], part.shape[1])
        self.sums[layer] = _pad_positions(self.sums[layer], grown) + _pad_positions(part, grown)
        self.counts[layer] = (
            _pad_positions(self.counts[layer][None, :, None], grown)[0, :, 0]
            + (_pad_positions(count[None, :, None], grown)[0, :, 0])
        )

    def result(self) -> dict[tuple[int, int], torch.Tensor]:
        out = {}
        for layer, heads in self.by_layer.items():
            if layer not in self.sums:
                continue
            mean = self.sums[layer] / self.counts[layer].clamp(min=1)[None, :, None]
            for index, head in enumerate(heads):
                out[(layer, head)] = mean[index].float()
        return out


def _pad_positions(values: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad ``[heads, T, D]`` along T to ``length``."""
    if values.shape[1] == length:
        return values
    pad = torch.zeros(values.shape[0], length - values.shape[1], values.shape[2], dtype=values.dtype)
    return torch.cat([values, pad], dim=1)


class _LayerSink:
    """Receives each layer's weights, chunk by chunk, during one forward pass; applies any ablation."""

    def __init__(
        self,
        callback: LayerCallback,
        batch: Batch,
        ablation: Ablation | None = None,
        on_layer_done: LayerDone | None = None,
        recorder: HeadOutputMeans | None = None,
    ) -> None:
        self.callback = callback
        self.batch = batch
        self.ablation = ablation
        self.on_layer_done = on_layer_done
        self.recorder = recorder
        self.calls = 0

    def begin(self, module: Any) -> int:
        layer = getattr(module, "layer_idx", None)
        if layer is None:  # models that do not number their attention modules run them in order
            layer = self.calls
        self.calls += 1
        return int(layer)

    def deliver(self, layer: int, weights: torch.Tensor, q_start: int) -> None:
        self.callback(layer, weights, self.batch, q_start)

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
    """
    if kwargs.get("s_aux") is not None:
        raise RunFailure(
            "this model uses attention sinks (s_aux), which streaming capture does not implement",
            hint="use --capture eager",
        )
    if attention_mask is None and getattr(module, "is_causal", False) and query.shape[2] > 1:
        # Without a mask these weights would let every token attend to the future. transformers
        # builds one through the registered mask function; if it ever does not, stop here.
        raise RunFailure(
            f"{type(module).__name__} is causal but its attention got no mask; streaming capture "
            "will not attend to the future",
            hint="use --capture eager",
        )
    n_rep = query.shape[1] // key.shape[1]
    key = _repeat_kv(key, n_rep)
    value = _repeat_kv(value, n_rep)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # The weights are produced, scored and multiplied into the values one query chunk at a time,
    # so no layer's full [B, H, T, T] map ever exists. In a causal layer the chunk of queries
    # q_start..stop-1 sees only keys < stop: the keys after it are skipped, which halves the work.
    batch, heads, length, _ = query.shape
    keys = key.shape[-2]
    chunk = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * keys))
    scaled = query * scaling  # scale the small tensor, not the map
    key_t = key.transpose(2, 3)
    output = torch.empty(batch, heads, length, value.shape[-1], dtype=value.dtype, device=value.device)
    sink = _ACTIVE_SINK.get()
    layer = sink.begin(module) if sink is not None else -1  # a layer index exactly when a sink listens
    for start in range(0, length, chunk):
        stop = min(length, start + chunk)
        rows = None
        if attention_mask is not None:
            rows = attention_mask if attention_mask.shape[2] == 1 else attention_mask[:, :, start:stop]
        limit = _visible_keys(rows, stop, keys)
        first = _first_visible_key(rows, limit)
        scores = torch.matmul(scaled[:, :, start:stop], key_t[..., first:limit])
        if softcap is not None:
            scores = torch.tanh(scores.div_(softcap)).mul_(softcap)
        if rows is not None:
            if rows.dtype == torch.bool:  # True = may attend
                scores.masked_fill_(~rows[..., first:limit], torch.finfo(scores.dtype).min)
            else:
                scores.add_(rows[..., first:limit])
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
        del scores
        output[:, :, start:stop] = torch.matmul(weights.to(value.dtype), value[:, :, first:limit])
        if sink is not None:
            if first > 0:  # detectors index keys from 0: the keys before the window get weight 0
                full = weights.new_zeros(*weights.shape[:-1], limit)
                full[..., first:] = weights
                weights = full
            sink.batch.set_chunk(start, stop, mask=rows[..., :limit] if rows is not None else None)
            sink.deliver(layer, weights, start)
        del weights
    if sink is not None:
        sink.end(layer)
        if sink.recorder is not None:
            sink.recorder.add(layer, output, sink.batch)
        if sink.ablation is not None:
            output = sink.ablation.apply(layer, output, sink.batch)
    return output.transpose(1, 2).contiguous(), None


def _first_visible_key(rows: torch.Tensor | None, limit: int) -> int:
    """The first key that any query of the chunk can see: a sliding window hides the keys before
    it from every query of a late chunk, and those are skipped (read from the mask, not assumed)."""
    if rows is None or rows.shape[2] == 1:
        return 0
    head = rows[..., :limit]
    open_ = head if head.dtype == torch.bool else head > torch.finfo(head.dtype).min / 2
    seen = open_.flatten(0, 2).any(0)  # [K']: does any row, head or query see key k?
    if not bool(seen.any()):
        return 0
    return int(seen.to(torch.int8).argmax())


def _visible_keys(rows: torch.Tensor | None, stop: int, keys: int) -> int:
    """How many leading keys a query chunk ending at ``stop`` can see under its additive mask.

    Keys from ``stop`` on are dropped only when the mask blocks every one of them (causal and
    sliding-window masks do; a padding-only or prefix-LM mask does not), so nothing is guessed.
    """
    if rows is None or rows.shape[2] == 1 or stop >= keys:
        return keys
    tail = rows[..., stop:keys]
    blocked = ~tail if tail.dtype == torch.bool else tail <= torch.finfo(tail.dtype).min / 2
    return stop if bool(blocked.all()) else keys


_registered = False


def register_streaming_attention() -> None:
    """Register the streaming function (and eager's additive mask) under STREAM_IMPLEMENTATION."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(STREAM_IMPLEMENTATION, streaming_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(STREAM_IMPLEMENTATION, eager_mask)
    _registered = True


@contextlib.contextmanager
def _sink(
    callback: LayerCallback,
    batch: Batch,
    ablation: Ablation | None = None,
    on_layer_done: LayerDone | None = None,
    recorder: HeadOutputMeans | None = None,
) -> Iterator[_LayerSink]:
    sink = _LayerSink(callback, batch, ablation, on_layer_done, recorder)
    token = _ACTIVE_SINK.set(sink)
    try:
        yield sink
    finally:
        _ACTIVE_SINK.reset(token)


def run(
    loaded: Any,
    batches: Iterable[Batch],
    on_layer: LayerCallback,
    *,
    on_layer_done: LayerDone | None = None,
    on_token_loss: Callable[[torch.Tensor, Batch], None] | None = None,
    on_batch_done: Callable[[Batch], None] | None = None,
    ablation: Ablation | None = None,
    recorder: HeadOutputMeans | None = None,
) -> None:
    """Run every batch through the model and give each layer's attention to ``on_layer``.

    ``on_layer(layer, weights, batch, q_start)`` receives float32 weights ``[B, H, c, K']`` for
    the queries ``q_start .. q_start + c - 1``, in order; ``K'`` may stop short of the batch's
    length when the keys after the chunk are all masked (their weight is 0). It must not modify
    ``weights``. ``on_layer_done(layer, batch)`` follows a layer's last chunk.
    The LM head runs only when ``on_token_loss`` is given: it receives ``[B, T-1]`` float32 losses
    of predicting token t+1 at position t, computed from the final hidden states in position
    chunks (:func:`next_token_losses`), so no ``[B, T, vocab]`` logits ever exist. ``ablation`` replaces chosen heads'
    outputs and ``recorder`` accumulates chosen heads' outputs (streaming capture only).
    """
    if (ablation is not None or recorder is not None) and loaded.capture_mode != "stream":
        raise RunFailure("head ablation needs streaming capture", hint="drop --capture eager")
    device = loaded.device
    if on_token_loss is not None and not loaded.has_lm_head:
        raise RunFailure("next-token losses need a language model with an LM head")
    module = loaded.base
    n_layers = loaded.layout.n_layers
    extra = {"use_cache": False} if loaded.is_causal else {}
    with torch.inference_mode():
        for batch in batches:
            on_device = batch.to(device)
            inputs = {"input_ids": on_device.input_ids, "attention_mask": on_device.attention_mask.long()}
            if loaded.capture_mode == "stream":
                with _sink(on_layer, on_device, ablation, on_layer_done, recorder) as sink:
                    out = module(**inputs, **extra)
                if sink.calls != n_layers:
                    raise RunFailure(
                        f"expected attention from {n_layers} layers, captured {sink.calls}",
                        hint="this architecture may need --capture eager",
                    )
            else:
                out = module(**inputs, **extra, output_attentions=True)
                attentions = out.attentions
                if attentions is None or len(attentions) != n_layers:
                    raise RunFailure("the model returned no attention weights in eager mode")
                for layer, weights in enumerate(attentions):
                    # No mask reaches us here: a key is visible when some head gives it weight
                    # (a masked key gets exactly 0 in every head).
                    length = weights.shape[2]
                    on_device.set_chunk(0, length, visible=(weights > 0).any(1))
                    on_layer(layer, weights.float(), on_device, 0)
                    if on_layer_done is not None:
                        on_layer_done(layer, on_device)
            if on_token_loss is not None:
                on_token_loss(
                    next_token_losses(loaded, out.last_hidden_state, on_device.input_ids), on_device
                )
            if on_batch_done is not None:
                on_batch_done(batch)


def head_output_means(
    loaded: Any, batches: Iterable[Batch], heads: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], torch.Tensor]:
    """The calibration pass of mean ablation: each head's mean output at each position, over the set."""
    recorder = HeadOutputMeans(heads)
    run(loaded, batches, lambda *_: None, recorder=recorder)
    return recorder.result()


_LOGIT_CHUNK_ELEMENTS = 1 << 24  # logits per position chunk (64 MB in float32)


def next_token_losses(loaded: Any, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T-1] cross-entropy of token t+1 given positions <= t, from final hidden states [B, T, D].

    The LM head (and Gemma's final logit soft-capping, where the config sets it) runs over a few
    positions at a time, and only each target's log-probability is kept. This is the model's own
    head applied to the base model's output, the same computation as ``model(...).logits``.
    """
    head = loaded.model.get_output_embeddings()
    softcap = getattr(loaded.model.config, "final_logit_softcapping", None)
    batch, length, _ = hidden.shape
    vocab = head.weight.shape[0]
    chunk = max(1, _LOGIT_CHUNK_ELEMENTS // max(1, batch * vocab))
    out = torch.empty(batch, max(length - 1, 0), dtype=torch.float32, device=hidden.device)
    for start in range(0, length - 1, chunk):
        stop = min(length - 1, start + chunk)
        logits = head(hidden[:, start:stop]).float()
        if softcap is not None:
            logits = torch.tanh(logits.div_(softcap)).mul_(softcap)
        targets = input_ids[:, start + 1 : stop + 1]
        picked = logits.gather(-1, targets[..., None])[..., 0]
        out[:, start:stop] = torch.logsumexp(logits, dim=-1) - picked
        del logits
    return out
