"""Checks, on the model itself, that headscope's decompositions reproduce it, before any number is reported.

Three views, each checked on a short random input and cached per model:

* ``maps``: the attention weights the detectors read. With streaming capture, the streamed maps and
  the final hidden states must equal the model's own eager attention (``output_attentions``), both
  with every row exact and with two rows a sequence exact and the rest through the fused kernel
  (the query-selective path, :mod:`headscope.capture.rows`). In eager capture the maps are the
  model's own, and the check only confirms they arrive.
* ``dla``: the per-head decomposition of the residual stream. Per attention layer, the heads' writes
  (their outputs through their slices of ``W_O``) plus the output bias must equal the output
  projection's output; taken through the block's own map onto the residual stream (a post-norm with
  its statistic frozen, Granite's ``residual_multiplier``), they must equal what the block really
  adds when its attention output is zeroed with every MLP/expert projection held at its clean
  output; consecutive blocks must pass the residual on unchanged; and the final norm plus LM head
  (with Cohere's ``logit_scale``, Granite's ``logits_scaling`` and Gemma's soft-cap) applied to the
  last residual must give the model's logits.
* ``ov``: each layer's OV circuit. In a one-token sequence every head attends only to the token, so
  the output projection's output must equal ``Σ_h value(x)[g(h)] @ W_O[h] + b_O`` from the extracted
  value path and ``W_O``, and the attention's input must be the extracted input norm of the block's
  input.

A view that fails is refused with the reason (:func:`require` raises :class:`Unsupported`), instead
of printing a number: these checks are the guard for every family not yet seen.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import HeadscopeError, RunFailure, Unsupported
from headscope.models import anatomy, projections

from . import rows
from .batch import Batch, make_batches
from .dla import FrozenNorm, attention_layers, residual_parts
from .hooks import hooked

log = logging.getLogger("headscope")

VIEWS: tuple[str, ...] = ("maps", "dla", "ov")
WHAT = {
    "maps": "attention maps",
    "dla": "direct logit attribution (per-head writes to the residual stream)",
    "ov": "OV circuits (per-head value and output weights)",
}


@dataclass(frozen=True)
class Conformance:
    """The outcome of one view's check: ``error`` is the largest relative error found."""

    view: str
    ok: bool
    error: float
    reason: str = ""
    how: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "view": self.view,
            "ok": self.ok,
            "error": None if math.isnan(self.error) else self.error,
            "reason": self.reason,
            "how": self.how,
        }


_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Conformance]] = weakref.WeakKeyDictionary()


def tolerance(loaded: Any) -> float:
    dtype = next(loaded.model.parameters()).dtype
    return 2e-3 if dtype == torch.float32 else 6e-2


def check(loaded: Any, view: str) -> Conformance:
    """Check one view on ``loaded``'s model (cached per model object and capture mode)."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; expected one of {VIEWS}")
    cache = _CACHE.setdefault(loaded.model, {})
    key = (view, loaded.capture_mode)
    if key not in cache:
        runner = {"maps": _check_maps, "dla": _check_dla, "ov": _check_ov}[view]
        try:
            cache[key] = runner(loaded)
        except HeadscopeError as exc:
            cache[key] = Conformance(view, False, math.nan, str(exc))
        except Exception as exc:  # an unread layout is a refusal with its reason, not a crash
            cache[key] = Conformance(view, False, math.nan, f"{type(exc).__name__}: {exc}")
    return cache[key]


def require(loaded: Any, *views: str) -> dict[str, Conformance]:
    """Check ``views``; raise :class:`Unsupported` naming the first that fails and why."""
    found = {}
    for view in views:
        result = check(loaded, view)
        if (
            view == "maps"
            and not result.ok
            and loaded.capture_mode == "stream"
            and loaded.capture_requested == "auto"
        ):
            # --capture auto: the model's own eager attention is always right, at the cost of
            # keeping every layer's maps until the end of each batch.
            log.warning(
                "%s: streaming capture failed its check (%s); falling back to eager attention "
                "(all layers' maps are kept per batch, so memory grows with layers x heads x T^2)",
                loaded.name,
                result.reason,
            )
            loaded.capture_mode = "eager"
            result = check(loaded, view)
        if not result.ok:
            raise Unsupported(
                f"{loaded.name} ({loaded.model.config.model_type}): headscope's {WHAT[view]} "
                f"do not reproduce this model, so nothing is reported from them: {result.reason}",
                hint="report the family to headscope; other analyses may still apply",
            )
        found[view] = result
    return found


def checked(loaded: Any) -> dict[str, Conformance]:
    """The views already checked on ``loaded``'s model in its current capture mode."""
    cache = _CACHE.get(loaded.model, {})
    return {view: result for (view, mode), result in cache.items() if mode == loaded.capture_mode}


# --- inputs and helpers ------------------------------------------------------------------------------


def _token_rows(loaded: Any, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Random ordinary token ids (special ids avoided), one row per length."""
    vocab = min(len(loaded.tokenizer), loaded.model.get_input_embeddings().num_embeddings)
    special = {i for i in loaded.tokenizer.all_special_ids if i is not None}
    pool = torch.tensor([i for i in range(vocab) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    return [pool[torch.randint(len(pool), (n,), generator=generator)].tolist() for n in lengths]


def _batch(loaded: Any, lengths: list[int]) -> Batch:
    rows = _token_rows(loaded, lengths)
    pad = loaded.tokenizer.pad_token_id
    return make_batches(
        rows,
        [[False] * len(r) for r in rows],
        batch_size=len(rows),
        pad_id=0 if pad is None else int(pad),
        is_causal=loaded.is_causal,
        sort_by_length=False,
    )[0].to(loaded.device)


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double().cpu(), expected.double().cpu()
    scale = float(expected.abs().max())
    if scale == 0.0:
        return float((actual - expected).abs().max())
    return float((actual - expected).abs().max()) / scale


def _verdict(loaded: Any, view: str, errors: dict[str, float], failed: str, how: str) -> Conformance:
    """The check's outcome from its parts' largest relative errors: refused on the worst part."""
    worst = max(errors, key=lambda k: errors[k])
    error = errors[worst]
    ok = error <= tolerance(loaded)
    return Conformance(view, ok, error, "" if ok else f"{worst}{failed}: relative error {error:.2e}", how)


def _first(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple | list) else value


def _cloned(value: Any) -> Any:
    """A copy of a module's output: blocks add to it in place (Falcon's ``mlp_output += attention``)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_cloned(v) for v in value)
    return value


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _forward(loaded: Any, batch: Batch) -> Any:
    """One forward pass of the full model (LM head included), as an analysis runs it."""
    from .stream import model_inputs, prepared

    with prepared(loaded), torch.inference_mode():
        return loaded.model(**model_inputs(loaded, batch))


# --- maps ----------------------------------------------------------------------------------------------


def _check_maps(loaded: Any) -> Conformance:
    from .reads import Attention, FinalHidden
    from .spec import Pass
    from .stream import STREAM_IMPLEMENTATION, model_inputs, prepared, run

    try:
        blocks = anatomy.blocks(loaded.model)
    except RunFailure:  # ALBERT shares one block across layers; the maps need no block list
        blocks = []
    for index in attention_layers(loaded) if blocks else []:
        # Raises Unsupported for attention that is not one softmax map per head (DiffLlama).
        projections.output_module(projections.attention_module(blocks[index]))

    batch = _batch(loaded, [14, 9])
    valid = batch.attention_mask.cpu()
    if loaded.capture_mode == "eager":
        seen: list[int] = []
        run(loaded, [batch], Pass(reads=[Attention(lambda layer, *_: seen.append(layer))]))
        expected = attention_layers(loaded)
        if sorted(seen) != expected:
            return Conformance("maps", False, math.nan, f"eager attention came from layers {seen}")
        return Conformance("maps", True, 0.0, how="the model's own eager attention weights")
    streamed: dict[int, torch.Tensor] = {}
    hidden: dict[str, torch.Tensor] = {}

    def on_layer(layer: int, weights: torch.Tensor, _batch: Batch, q_start: int) -> None:
        full = streamed.setdefault(
            layer, torch.zeros(weights.shape[0], weights.shape[1], valid.shape[1], valid.shape[1])
        )
        full[:, :, q_start : q_start + weights.shape[2], : weights.shape[3]] = weights.cpu()

    stream_hidden = FinalHidden(lambda h, _b: hidden.setdefault("stream", h.float().cpu()))
    run(loaded, [batch], Pass(reads=[Attention(on_layer), stream_hidden]))
    # The selective path: exact weights for two rows of each sequence (its fourth and last
    # tokens), every other row through the fused kernel. Those rows' maps and the final states
    # must equal the model's eager attention too.
    chosen: dict[int, torch.Tensor] = {}

    def on_chosen(layer: int, weights: torch.Tensor, _batch: Batch, q_start: int) -> None:
        full = chosen.setdefault(
            layer, torch.zeros(weights.shape[0], weights.shape[1], valid.shape[1], valid.shape[1])
        )
        full[:, :, q_start : q_start + weights.shape[2], : weights.shape[3]] = weights.cpu()

    def reads(b: Batch) -> torch.Tensor:
        mask = rows.last_row(b)
        mask[:, 3] = True
        return mask

    selective_hidden = FinalHidden(lambda h, _b: hidden.setdefault("selective", h.float().cpu()))
    run(loaded, [batch], Pass(reads=[Attention(on_chosen, rows=reads), selective_hidden]))
    read_rows = reads(batch).cpu()
    model = loaded.model
    with prepared(loaded), torch.inference_mode():
        model.set_attn_implementation("eager")
        try:
            out = loaded.base(**model_inputs(loaded, batch), output_attentions=True)
        finally:
            model.set_attn_implementation(STREAM_IMPLEMENTATION)
    eager = [a for a in (out.attentions or ()) if a is not None]
    layers = sorted(streamed)
    if len(eager) != len(layers):
        return Conformance(
            "maps", False, math.nan, f"streamed {len(layers)} layers' maps, eager returned {len(eager)}"
        )
    pairs = valid[:, None, :, None] & valid[:, None, None, :]
    picked = pairs & read_rows.any(0)[None, None, :, None]
    if sorted(chosen) != layers:
        return Conformance("maps", False, math.nan, "the selective path did not reach every layer")
    error = 0.0
    for layer, reference in zip(layers, eager, strict=True):
        reference = reference.float().cpu()
        diff = (streamed[layer] - reference).abs().masked_fill(~pairs, 0.0)
        error = max(error, float(diff.max()))
        diff = (chosen[layer] - reference).abs().masked_fill(~picked, 0.0)
        error = max(error, float(diff.max()))
    states = valid[..., None]
    for path in ("stream", "selective"):
        error = max(
            error,
            _relative(
                hidden[path].masked_fill(~states, 0.0),
                out.last_hidden_state.float().cpu().masked_fill(~states, 0.0),
            ),
        )
    ok = error <= tolerance(loaded)
    return Conformance(
        "maps",
        ok,
        error,
        "" if ok else f"streamed attention differs from the model's eager attention by {error:.2e}",
        "streamed maps and outputs = the model's eager attention (padded batch), all rows "
        "exact and two rows a sequence exact with the rest fused",
    )


# --- DLA ------------------------------------------------------------------------------------------------


@dataclass
class _Layer:
    block: torch.nn.Module
    attention: torch.nn.Module
    output: torch.nn.Module
    w_o: torch.Tensor  # [H, dv, D]
    b_o: torch.Tensor | None
    post: FrozenNorm | None


def _layers(loaded: Any) -> dict[int, _Layer]:
    blocks = anatomy.blocks(loaded.model)
    found = {}
    for index in attention_layers(loaded):
        block = blocks[index]
        attention = projections.attention_module(block)
        w_o, b_o = projections.output_projection(attention, loaded.layout.n_heads)
        norm = anatomy.post_attention_norm(block)
        post = FrozenNorm.of(norm, f"post-attention norm of layer {index}") if norm is not None else None
        found[index] = _Layer(block, attention, projections.output_module(attention), w_o.detach(), b_o, post)
    return found


def _check_dla(loaded: Any) -> Conformance:
    if not loaded.has_lm_head:
        return Conformance(
            "dla", False, math.nan, "the model has no LM head, so there are no logits to attribute"
        )
    model = loaded.model
    config = model.config
    blocks = anatomy.blocks(model)
    layers = _layers(loaded)
    multiplier = anatomy.residual_multiplier(config)
    final_module = anatomy.final_norm(model)
    final = FrozenNorm.of(final_module)
    head = anatomy.lm_head(model)
    batch = _batch(loaded, [12])
    n_heads = loaded.layout.n_heads
    block_in: dict[int, torch.Tensor] = {}
    block_out: dict[int, torch.Tensor] = {}
    heads_in: dict[int, torch.Tensor] = {}
    projected: dict[int, torch.Tensor] = {}
    frozen_out: dict[int, Any] = {}
    final_in: dict[str, torch.Tensor] = {}

    def record_in(index: int) -> Callable[..., None]:
        def hook(_m: Any, args: tuple, kwargs: dict) -> None:
            block_in[index] = _hidden_arg(args, kwargs).detach().clone()

        return hook

    def record_out(store: dict, index: int) -> Callable[..., None]:
        def hook(_m: Any, _args: Any, output: Any) -> None:
            store[index] = _first(output).detach().clone()

        return hook

    frozen = {
        index: anatomy.frozen_modules(blocks[index], layer.attention) for index, layer in layers.items()
    }
    with hooked() as hooks:
        for index, block in enumerate(blocks):
            hooks.before(block, record_in(index), with_kwargs=True)
            hooks.after(block, record_out(block_out, index))
        for index, layer in layers.items():
            hooks.before(
                layer.output, lambda _m, args, i=index: heads_in.__setitem__(i, args[0].detach().clone())
            )
            hooks.after(layer.output, record_out(projected, index))
            for number, module in enumerate(frozen[index]):
                hooks.after(
                    module, lambda _m, _a, out, key=(index, number): frozen_out.__setitem__(key, _cloned(out))
                )
        hooks.before(
            final_module,
            lambda _m, args, kwargs: final_in.__setitem__("r", _hidden_arg(args, kwargs).detach().clone()),
            with_kwargs=True,
        )
        clean = _forward(loaded, batch)
    logits = clean.logits.double().cpu()
    errors: dict[str, float] = {}
    # 1. the heads' writes add up to the output projection's output
    writes = {}
    for index, layer in layers.items():
        inputs = heads_in[index].double().cpu()
        per_head = inputs.reshape(*inputs.shape[:-1], n_heads, -1)
        writes[index] = torch.einsum("bthd,hde->bthe", per_head, layer.w_o.double().cpu())
        bias = (
            layer.b_o.detach().double().cpu()
            if layer.b_o is not None
            else torch.zeros(writes[index].shape[-1])
        )
        total = writes[index].sum(-2) + bias
        errors["heads sum to W_O's output"] = max(
            errors.get("heads sum to W_O's output", 0.0), _relative(total, projected[index])
        )
    # 2. what the attention output adds to the residual, with the block's MLP projections held fixed
    ablated: dict[int, torch.Tensor] = {}
    with hooked() as hooks:
        for index in layers:
            block = blocks[index]

            def replace_input(_m: Any, args: tuple, kwargs: dict, i: int = index) -> Any:
                if args:
                    return (block_in[i], *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": block_in[i]}

            hooks.before(block, replace_input, with_kwargs=True)
            hooks.after(block, record_out(ablated, index))
            hooks.after(
                layers[index].output,
                lambda _m, _a, out: torch.zeros_like(out) if isinstance(out, torch.Tensor) else out,
            )
            for number, module in enumerate(frozen[index]):
                hooks.after(module, lambda _m, _a, _out, key=(index, number): _cloned(frozen_out[key]))
        _forward(loaded, batch)
    for index, layer in layers.items():
        bias = (
            layer.b_o.detach().double().cpu()
            if layer.b_o is not None
            else torch.zeros(writes[index].shape[-1])
        )
        heads_part, bias_part = residual_parts(writes[index], bias, layer.post, multiplier)
        at_zero = (layer.post.bias * multiplier) if layer.post is not None else torch.zeros_like(bias_part)
        modelled = heads_part.sum(-2) + bias_part - at_zero
        actual = block_out[index].double().cpu() - ablated[index].double().cpu()
        errors["the attention output's residual update"] = max(
            errors.get("the attention output's residual update", 0.0), _relative(modelled, actual)
        )
    # 3. the residual stream passes from block to block, and on to the final norm, unchanged
    passing = 0.0
    for index in range(len(blocks) - 1):
        passing = max(passing, _relative(block_in[index + 1], block_out[index]))
    passing = max(passing, _relative(final_in["r"], block_out[len(blocks) - 1]))
    errors["the residual stream between blocks"] = passing
    # 4. the final norm and the LM head give the model's logits
    residual = final_in["r"].double().cpu()
    w_u = head.weight.detach().double().cpu()
    rebuilt = final.apply(residual) @ w_u.T
    if getattr(head, "bias", None) is not None:
        rebuilt = rebuilt + head.bias.detach().double().cpu()
    rebuilt = rebuilt * anatomy.logit_multiplier(config)
    cap = anatomy.final_softcap(config)
    if cap is not None:
        rebuilt = torch.tanh(rebuilt / cap) * cap
    errors["final norm and LM head give the logits"] = _relative(rebuilt, logits)
    return _verdict(
        loaded,
        "dla",
        errors,
        "",
        "heads' writes = W_O output; residual update with MLPs frozen; final norm + LM head = logits",
    )


# --- OV --------------------------------------------------------------------------------------------------


def _check_ov(loaded: Any) -> Conformance:
    from .reads import Attention
    from .spec import Pass
    from .stream import run

    layers = _layers(loaded)
    config = anatomy.text_config(loaded.model.config)
    n_heads, n_kv = loaded.layout.n_heads, loaded.layout.n_kv_heads
    group = n_heads // n_kv
    rows = _token_rows(loaded, [1] * 6, seed=1)
    batch = make_batches(
        rows, [[False]] * len(rows), batch_size=len(rows), pad_id=0, is_causal=loaded.is_causal
    )[0].to(loaded.device)
    block_in: dict[int, torch.Tensor] = {}
    attention_in: dict[int, torch.Tensor] = {}
    projected: dict[int, torch.Tensor] = {}
    with hooked() as hooks:
        for index, layer in layers.items():
            hooks.before(
                layer.block,
                lambda _m, a, k, i=index: block_in.__setitem__(i, _hidden_arg(a, k).detach().clone()),
                with_kwargs=True,
            )
            hooks.before(
                layer.attention,
                lambda _m, a, k, i=index: attention_in.__setitem__(i, _hidden_arg(a, k).detach().clone()),
                with_kwargs=True,
            )
            hooks.after(
                layer.output,
                lambda _m, _a, out, i=index: projected.__setitem__(i, _first(out).detach().clone()),
            )
        # Each head's weight on the one key: 1, but for attention sinks (GPT-OSS), which take a share.
        weight_on_self: dict[int, torch.Tensor] = {}

        def on_layer(layer: int, weights: torch.Tensor, _batch: Batch, _q: int) -> None:
            weight_on_self[layer] = weights[:, :, 0, 0].double().cpu()

        run(loaded, [batch], Pass(reads=[Attention(on_layer)]))
    errors = {"one-token output": 0.0, "input norm": 0.0}
    for index, layer in layers.items():
        path = projections.value_path(layer.attention, config)
        x = attention_in[index][:, 0]
        with torch.inference_mode():
            values = path(x).double().cpu()  # [N, kv, dv]
        w_o = layer.w_o.double().cpu()
        per_head = values[:, torch.arange(n_heads) // group] * weight_on_self[index][..., None]
        expected = torch.einsum("nhd,hde->ne", per_head, w_o)
        if layer.b_o is not None:
            expected = expected + layer.b_o.detach().double().cpu()
        errors["one-token output"] = max(
            errors["one-token output"], _relative(expected, projected[index][:, 0])
        )
        norm = projections.input_norm(layer.block)
        with torch.inference_mode():
            normed = norm(block_in[index]) if norm is not None else block_in[index]
        errors["input norm"] = max(errors["input norm"], _relative(normed, attention_in[index]))
    return _verdict(
        loaded,
        "ov",
        errors,
        " not reproduced from the extracted weights",
        "one-token pass: Σ_h value(x)·W_O[h] + b_O = the module's output; input norm = the block's",
    )
