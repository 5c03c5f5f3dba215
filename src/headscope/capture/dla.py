"""Per-head writes to the residual stream and their direct logit attribution (DLA).

A head's write at a position is its attention output there taken through its own slice of the
output projection: ``out[h] @ W_O[h]``, a ``d_model`` vector. Where the architecture normalises
the attention block's output before adding it to the residual stream (Gemma 2 and 3,
``post_attention_layernorm``), each head's share is scaled by that norm's statistic of the *actual*
block output, so the heads' shares plus the projection bias sum to what the block really adds.

The direct logit attribution of a write toward ``target`` against ``foil`` is the write scaled by
the final norm's statistic of the actual final residual at that position, as TransformerLens'
``apply_ln_to_stack`` does, then dotted with ``W_U[target] - W_U[foil]``. The final norm is
linear once its statistic is frozen, so the heads' DLA plus that of the other components
(embeddings, MLPs, projection biases, the norm's bias and the unembedding bias) equals the
model's logit difference before any final soft-capping.

Only the chosen positions are kept: ``[positions, heads, d_model]`` at most, never ``[T, heads,
d_model]``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import RunFailure
from headscope.models import anatomy, projections

from .batch import Batch
from .hooks import hooked


@dataclass(frozen=True)
class FrozenNorm:
    """A LayerNorm or RMSNorm as ``gain * (x - centred * mean(x)) / scale(x) + bias``."""

    gain: torch.Tensor  # [D] float64 (Gemma's ``1 + w`` already added)
    bias: torch.Tensor  # [D] float64 (zeros for RMSNorm)
    eps: float
    centred: bool  # LayerNorm subtracts the mean; RMSNorm does not

    @classmethod
    def of(cls, norm: torch.nn.Module, what: str = "final norm") -> FrozenNorm:
        """Read the norm's gain, bias, epsilon and centring by probing the module, then check the
        reading on random input: any LayerNorm or RMSNorm variant (Gemma's ``1 + w``, Cohere's
        LayerNorm without bias) is read the same way, and anything else is refused."""
        weight = getattr(norm, "weight", None)
        if weight is None:
            raise RunFailure(f"the {what} ({type(norm).__name__}) has no weight; DLA cannot read it")
        dim = weight.shape[-1]
        device, dtype = weight.device, weight.dtype
        eps = next(
            (
                float(getattr(norm, name))
                for name in ("variance_epsilon", "eps", "epsilon")
                if isinstance(getattr(norm, name, None), int | float)
            ),
            1e-6,
        )

        def run(x: torch.Tensor) -> torch.Tensor:
            return norm(x.to(device=device, dtype=dtype)).double().cpu()

        generator = torch.Generator().manual_seed(0)
        probe = torch.randn(3, dim, generator=generator, dtype=torch.float64) * 2.0
        with torch.no_grad():
            # A norm that subtracts the mean gives the same output when every entry is shifted.
            centred = bool(torch.allclose(run(probe), run(probe + 3.0), rtol=1e-3, atol=1e-3))
            bias = run(torch.zeros(1, dim, dtype=torch.float64))[0]
            if centred:
                unit = torch.where(torch.arange(dim) % 2 == 0, 1.0, -1.0).double()
                unit = unit - unit.mean()
                unit = unit / unit.pow(2).mean().sqrt()
            else:
                unit = torch.ones(dim, dtype=torch.float64)
            gain = (run(unit[None])[0] - bias) * math.sqrt(1.0 + eps) / unit
            found = cls(gain, bias, eps, centred)
            expected = found.apply(probe)
            actual = run(probe)
        tolerance = 1e-3 if dtype == torch.float32 else 5e-2
        if not torch.allclose(actual, expected, rtol=tolerance, atol=tolerance):
            raise RunFailure(
                f"the {what} ({type(norm).__name__}) is neither an RMSNorm nor a LayerNorm; "
                "direct logit attribution needs one of them"
            )
        return found

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """[...] the statistic the norm divides by (float64)."""
        x = x.double()
        if self.centred:
            return torch.sqrt(x.var(-1, unbiased=False) + self.eps)
        return torch.sqrt(x.pow(2).mean(-1) + self.eps)

    def linear(self, parts: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The norm of a sum applied to one summand, with the sum's statistic ``scale`` frozen."""
        parts = parts.double()
        if self.centred:
            parts = parts - parts.mean(-1, keepdim=True)
        return parts * self.gain.to(parts.device) / scale[..., None]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, self.scale(x)) + self.bias.to(x.device)

    def fold(self, direction: torch.Tensor) -> torch.Tensor:
        """``v`` such that ``v @ x / scale(x) == (norm(x) - bias) @ direction``."""
        folded = direction.double() * self.gain.to(direction.device)
        if self.centred:
            folded = folded - folded.mean(-1, keepdim=True)
        return folded


# --- what the attention output adds to the residual stream ----------------------------------------


def residual_parts(
    writes: torch.Tensor, bias: torch.Tensor, post: FrozenNorm | None, multiplier: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The heads' shares ``[..., H, D]`` and the bias share ``[..., D]`` of what an attention output
    adds to the residual stream: through the block's post-norm (OLMo 2, Gemma 2/3), with the
    statistic of the whole output, then the residual multiplier (Granite). ``writes`` are the heads'
    outputs through their slices of ``W_O``; ``bias`` is the output projection's bias."""
    if post is not None:
        scale = post.scale(writes.sum(-2) + bias)
        writes = post.linear(writes, scale[..., None])
        bias = post.linear(bias, scale) + post.bias
    return writes * multiplier, bias * multiplier


def post_norms(loaded: Any, layers: list[int]) -> dict[int, FrozenNorm]:
    blocks = anatomy.blocks(loaded.model)
    found = {}
    for index in layers:
        norm = anatomy.post_attention_norm(blocks[index])
        if norm is not None:
            found[index] = FrozenNorm.of(norm, f"post-attention norm of layer {index}")
    return found


def unembedding(loaded: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    head = anatomy.lm_head(loaded.model)
    return head.weight, getattr(head, "bias", None)


def attention_layers(loaded: Any) -> list[int]:
    """The layers with softmax attention (all of them but in hybrid models)."""
    layers = getattr(loaded.layout, "attention_layers", None)
    if isinstance(layers, tuple | list):
        return list(layers)
    return list(range(loaded.layout.n_layers))


# --- the recorder ------------------------------------------------------------------------------------

PositionsOf = Callable[[Batch], torch.Tensor]  # [B] one position per row
_W_O_CACHE_BYTES = 128 << 20  # a recorder keeps float64 W_O of all layers up to this size
TokensOf = Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]  # ([B] target ids, [B] foil ids)


class HeadWrites:
    """Records each head's write at one chosen position per row, and its DLA toward a target.

    A read of a pass (``Pass(reads=[HeadWrites(...)])``). The heads' outputs are read where the
    model itself combines them: the input of each attention layer's output projection, so this
    works in streaming and in eager capture alike. Per batch it leaves

    * ``dla``: ``[B, L, H]`` float64 direct logit attribution (when ``tokens_of`` is given),
    * ``bias_dla``: ``[B, L]`` that of each layer's output-projection bias,
    * ``kept``: ``{layer: [B, H, D]}`` the writes themselves for the layers in ``keep``,
    * ``final_scale``: ``[B]`` the final norm's statistic at the position,
    * ``final_residual``: ``[B, D]`` the residual entering the final norm there.

    The decomposition is trusted only where :func:`headscope.capture.checks.require` has checked it
    on the model (``"dla"``); the analyses that use this class ask for that first.
    """

    def __init__(
        self,
        loaded: Any,
        positions_of: PositionsOf,
        tokens_of: TokensOf | None = None,
        keep: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        self.loaded = loaded
        self.positions_of = positions_of
        self.tokens_of = tokens_of
        self.keep = set(keep)
        model = loaded.model
        self.blocks = anatomy.blocks(model)
        self.layers = attention_layers(loaded)
        self.outputs: dict[int, torch.nn.Module] = {}
        self.w_o: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for index in self.layers:
            attention = projections.attention_module(self.blocks[index])
            self.outputs[index] = projections.output_module(attention)
            self.w_o[index] = projections.output_projection(attention, loaded.layout.n_heads)
        # float64 copies of W_O, made once per recorder where they are small (else once per pass).
        self._w_o64: dict[int, torch.Tensor] = {}
        self._cache_w_o = sum(w.numel() for w, _ in self.w_o.values()) * 8 <= _W_O_CACHE_BYTES
        self.post_norms = post_norms(loaded, self.layers)
        self.multiplier = anatomy.residual_multiplier(model.config)
        self._final_module = anatomy.final_norm(model) if tokens_of is not None else None
        self.final = FrozenNorm.of(self._final_module) if self._final_module is not None else None
        if tokens_of is not None:
            self.w_u, self.b_u = unembedding(loaded)
        self.reset()

    def reset(self) -> None:
        self.dla: torch.Tensor | None = None
        self.bias_dla: torch.Tensor | None = None
        self.kept: dict[int, torch.Tensor] = {}
        self.final_scale: torch.Tensor | None = None
        self.final_residual: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._folded: torch.Tensor | None = None

    def begin(self, batch: Batch) -> None:
        """Called by the capture before each forward pass."""
        self.reset()
        n_layers, n_heads = self.loaded.layout.n_layers, self.loaded.layout.n_heads
        rows = batch.input_ids.shape[0]
        self._positions = self.positions_of(batch).to(batch.input_ids.device)
        if self.tokens_of is not None:
            assert self.final is not None
            target, foil = self.tokens_of(batch)
            w_u = self.w_u.detach()
            direction = (w_u[target.to(w_u.device)] - w_u[foil.to(w_u.device)]).double()
            # Cohere's logit_scale and Granite's 1 / logits_scaling multiply every logit.
            direction = direction * anatomy.logit_multiplier(self.loaded.model.config)
            self._folded = self.final.fold(direction.cpu())  # [B, D]
            self.dla = torch.zeros(rows, n_layers, n_heads, dtype=torch.float64)
            self.bias_dla = torch.zeros(rows, n_layers, dtype=torch.float64)

    def add(self, layer: int, heads: torch.Tensor) -> None:
        """``heads`` is the output projection's input ``[B, T, H * head_dim]`` in layer ``layer``."""
        if self._positions is None or (self._folded is None and layer not in self.keep):
            return
        w_o, bias = self.w_o[layer]
        rows = torch.arange(heads.shape[0], device=heads.device)
        at = heads[rows, self._positions.to(heads.device)]  # [B, H * head_dim]
        at = at.reshape(at.shape[0], w_o.shape[0], -1)  # [B, H, head_dim]
        w_o64 = self._w_o64.get(layer)
        if w_o64 is None:
            w_o64 = w_o.detach().double()
            if self._cache_w_o:
                self._w_o64[layer] = w_o64
        writes = torch.einsum("bhd,hde->bhe", at.double(), w_o64).cpu()  # [B, H, D]
        bias_part = (
            bias.detach().double().cpu().expand(writes.shape[0], -1)
            if bias is not None
            else torch.zeros(writes.shape[0], writes.shape[-1], dtype=torch.float64)
        )
        writes, bias_part = residual_parts(writes, bias_part, self.post_norms.get(layer), self.multiplier)
        if layer in self.keep:
            self.kept[layer] = writes.float()
        if self._folded is not None:
            assert self.dla is not None and self.bias_dla is not None
            self.dla[:, layer] = torch.einsum("bhe,be->bh", writes, self._folded)
            self.bias_dla[:, layer] = (bias_part * self._folded).sum(-1)

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """While active, the heads' outputs and the final norm's input at the chosen positions are recorded."""

        def heads_hook(layer: int) -> Callable[..., None]:
            def hook(_module: Any, args: tuple) -> None:
                self.add(layer, args[0])

            return hook

        def final_hook(_module: Any, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            if self._positions is None or hidden.dim() != 3:
                return
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            residual = hidden[rows, self._positions.to(hidden.device)].double().cpu()
            assert self.final is not None
            self.final_residual = residual
            self.final_scale = self.final.scale(residual)

        with hooked() as hooks:
            for layer, module in self.outputs.items():
                hooks.before(module, heads_hook(layer))
            if self._final_module is not None:
                hooks.before(self._final_module, final_hook, with_kwargs=True)
            yield

    def finish(self) -> None:
        """Divide by the final norm's statistic, once the forward pass has reached it."""
        if self.dla is None:
            return
        if self.final_scale is None:
            raise RunFailure("the final norm never ran; direct logit attribution needs it")
        self.dla /= self.final_scale[:, None, None]
        assert self.bias_dla is not None
        self.bias_dla /= self.final_scale[:, None]

    def residual_dla(self, vectors: torch.Tensor) -> torch.Tensor:
        """DLA of other residual components ``[B, D]`` at the recorded positions (for checks)."""
        assert self._folded is not None and self.final_scale is not None
        return (vectors.double().cpu() * self._folded).sum(-1) / self.final_scale


def logit_constant(writes: HeadWrites, target: torch.Tensor, foil: torch.Tensor) -> torch.Tensor:
    """[B] ``(bias_final @ (W_U[t] - W_U[f]) + b_U[t] - b_U[f]) * logit multiplier``: the logit
    difference no residual component is responsible for."""
    assert writes.final is not None
    w_u = writes.w_u.detach()
    direction = (w_u[target.to(w_u.device)] - w_u[foil.to(w_u.device)]).double().cpu()
    constant = direction @ writes.final.bias
    if writes.b_u is not None:
        b_u = writes.b_u.detach().double().cpu()
        constant = constant + b_u[target.cpu()] - b_u[foil.cpu()]
    return constant * anatomy.logit_multiplier(writes.loaded.model.config)
