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

from .batch import Batch


@dataclass(frozen=True)
class FrozenNorm:
    """A LayerNorm or RMSNorm as ``gain * (x - centred * mean(x)) / scale(x) + bias``."""

    gain: torch.Tensor  # [D] float64 (Gemma's ``1 + w`` already added)
    bias: torch.Tensor  # [D] float64 (zeros for RMSNorm)
    eps: float
    centred: bool  # LayerNorm subtracts the mean; RMSNorm does not

    @classmethod
    def of(cls, norm: torch.nn.Module, what: str = "final norm") -> FrozenNorm:
        """Read the norm's parameters and check them against the module itself on random input."""
        weight = getattr(norm, "weight", None)
        if weight is None:
            raise RunFailure(f"the {what} ({type(norm).__name__}) has no weight; DLA cannot read it")
        dim = weight.shape[-1]
        device, dtype = weight.device, weight.dtype
        eps = next(
            (
                float(getattr(norm, name))
                for name in ("variance_epsilon", "eps", "epsilon")
                if hasattr(norm, name)
            ),
            1e-6,
        )
        with torch.no_grad():
            if isinstance(norm, torch.nn.LayerNorm):
                bias = norm.bias if norm.bias is not None else torch.zeros_like(weight)
                found = cls(weight.double().cpu(), bias.double().cpu(), float(norm.eps), True)
            else:  # RMSNorm and its variants (Gemma's 1 + w): the gain is what a unit-RMS input gets
                ones = torch.ones(1, dim, device=device, dtype=dtype)
                gain = norm(ones).double().cpu()[0] * math.sqrt(1.0 + eps)
                found = cls(gain, torch.zeros(dim, dtype=torch.float64), eps, False)
            probe = torch.randn(3, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2.0
            expected = found.apply(probe)
            actual = norm(probe.to(device=device, dtype=dtype)).double().cpu()
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


# --- where things are in a Hugging Face model ---------------------------------------------------------


def decoder_layers(base: Any) -> list[torch.nn.Module]:
    """The model's decoder (or encoder) blocks, in order."""
    for path in ("layers", "h", "layer", "decoder.layers", "encoder.layer", "language_model.layers"):
        module = base
        for part in path.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return list(module)
    raise RunFailure(f"cannot find the transformer blocks of {type(base).__name__}")


def final_norm(base: Any) -> torch.nn.Module:
    for name in ("norm", "ln_f", "final_layer_norm", "final_layernorm", "final_norm"):
        module = getattr(base, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise RunFailure(
        f"cannot find the final norm of {type(base).__name__}; direct logit attribution needs it"
    )


def output_projection(attention: torch.nn.Module, n_heads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``W_O`` as ``[heads, head_dim, d_model]`` and its bias, from an attention module."""
    for name in ("o_proj", "out_proj", "dense", "c_proj"):
        proj = getattr(attention, name, None)
        if proj is None or not hasattr(proj, "weight"):
            continue
        weight = proj.weight
        # Linear stores [d_model, heads * head_dim]; GPT-2's Conv1D stores [in, out].
        w_o = weight.T if isinstance(proj, torch.nn.Linear) else weight
        inner, d_model = w_o.shape
        return w_o.reshape(n_heads, inner // n_heads, d_model), getattr(proj, "bias", None)
    raise RunFailure(f"cannot find the output projection of {type(attention).__name__}")


def post_attention_norm(block: torch.nn.Module) -> torch.nn.Module | None:
    """The norm applied to the attention output before the residual add (Gemma 2/3), if any.

    In Llama-style blocks ``post_attention_layernorm`` is the MLP's input norm instead; the blocks
    that normalise the attention output also have a separate ``pre_feedforward_layernorm``.
    """
    if hasattr(block, "pre_feedforward_layernorm") and hasattr(block, "post_attention_layernorm"):
        return block.post_attention_layernorm
    return None


def unembedding(loaded: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    head = loaded.model.get_output_embeddings()
    if head is None:
        raise RunFailure("direct logit attribution needs a language model with an LM head")
    return head.weight, getattr(head, "bias", None)


# --- the recorder ------------------------------------------------------------------------------------

PositionsOf = Callable[[Batch], torch.Tensor]  # [B] one position per row
TokensOf = Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]  # ([B] target ids, [B] foil ids)


class HeadWrites:
    """Records each head's write at one chosen position per row, and its DLA toward a target.

    Used as the ``writes`` argument of :func:`headscope.capture.run`. Per batch it leaves

    * ``dla``: ``[B, L, H]`` float64 direct logit attribution (when ``tokens_of`` is given),
    * ``bias_dla``: ``[B, L]`` that of each layer's output-projection bias,
    * ``kept``: ``{layer: [B, H, D]}`` the writes themselves for the layers in ``keep``,
    * ``final_scale``: ``[B]`` the final norm's statistic at the position,
    * ``final_residual``: ``[B, D]`` the residual entering the final norm there.
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
        base = loaded.base
        self.blocks = decoder_layers(base)
        self.post_norms: dict[int, FrozenNorm] = {}
        for index, block in enumerate(self.blocks):
            norm = post_attention_norm(block)
            if norm is not None:
                self.post_norms[index] = FrozenNorm.of(norm, f"post-attention norm of layer {index}")
        self._final_module = final_norm(base) if tokens_of is not None else None
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
            self._folded = self.final.fold(direction.cpu())  # [B, D]
            self.dla = torch.zeros(rows, n_layers, n_heads, dtype=torch.float64)
            self.bias_dla = torch.zeros(rows, n_layers, dtype=torch.float64)

    def add(self, layer: int, module: torch.nn.Module, output: torch.Tensor, batch: Batch) -> None:
        """``output`` is the attention module's per-head output ``[B, H, T, head_dim]``."""
        if self._positions is None or (self._folded is None and layer not in self.keep):
            return
        rows = torch.arange(output.shape[0], device=output.device)
        at = output[rows, :, self._positions.to(output.device)]  # [B, H, head_dim]
        w_o, bias = output_projection(module, at.shape[1])
        writes = torch.einsum("bhd,hde->bhe", at.double(), w_o.detach().double()).cpu()  # [B, H, D]
        bias_part = (
            bias.detach().double().cpu().expand(writes.shape[0], -1)
            if bias is not None
            else torch.zeros(writes.shape[0], writes.shape[-1], dtype=torch.float64)
        )
        post = self.post_norms.get(layer)
        if post is not None:
            scale = post.scale(writes.sum(1) + bias_part)  # the block's actual output at the position
            writes = post.linear(writes, scale[:, None])
            bias_part = post.linear(bias_part, scale) + post.bias
        if layer in self.keep:
            self.kept[layer] = writes.float()
        if self._folded is not None:
            assert self.dla is not None and self.bias_dla is not None
            self.dla[:, layer] = torch.einsum("bhe,be->bh", writes, self._folded)
            self.bias_dla[:, layer] = (bias_part * self._folded).sum(-1)

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """While active, the final norm's input at the chosen positions is recorded."""
        if self._final_module is None:
            yield
            return

        def hook(_module: Any, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            if self._positions is None or hidden.dim() != 3:
                return
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            residual = hidden[rows, self._positions.to(hidden.device)].double().cpu()
            assert self.final is not None
            self.final_residual = residual
            self.final_scale = self.final.scale(residual)

        handle = self._final_module.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

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
    """[B] ``bias_final @ (W_U[t] - W_U[f]) + b_U[t] - b_U[f]``: the logit difference no residual
    component is responsible for."""
    assert writes.final is not None
    w_u = writes.w_u.detach()
    direction = (w_u[target.to(w_u.device)] - w_u[foil.to(w_u.device)]).double().cpu()
    constant = direction @ writes.final.bias
    if writes.b_u is not None:
        b_u = writes.b_u.detach().double().cpu()
        constant = constant + b_u[target.cpu()] - b_u[foil.cpu()]
    return constant
