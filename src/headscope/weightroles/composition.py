"""Q- and K-composition between attention heads, read from the weights alone (Elhage et al. 2021).

An earlier head composes with a later one when what it writes into the residual stream lands where the
later head's queries or keys read. With row vectors (``x @ W``), for source head ``(l1, h1)`` and
destination head ``(l2, h2)``, ``l1 < l2``::

    W_OV  = W_V[g(h1)] @ W_O[h1]                  [d_model, d_model], rank <= d_head
    W_QK  = W_Q[h2] @ W_K[g(h2)]^T                [d_model, d_model], rank <= d_head
    score(left, right) = ||left @ right||_F / (||left||_F * ||right||_F)
    Q-composition = score(W_OV, W_QK)             the source's write read by the queries
    K-composition = score(W_OV, W_QK^T)           the source's write read by the keys

This is TransformerLens' convention exactly: ``HookedTransformer.all_composition_scores(mode)``
takes ``left = self.OV`` and ``right = self.QK`` for "Q", ``right = self.QK.T`` for "K", and
``utils.composition_scores(left, right)`` divides ``||left @ right||`` by both norms. It is also the
circuit's own algebra: the attention logit is ``x_q W_QK x_k^T``; a source's write ``y W_OV`` in the
query is read through ``W_OV W_QK``, and in the key through ``x_q W_QK (y W_OV)^T``, whose norm is
``||W_OV W_QK^T||``. ``g(h) = h // (H / H_kv)`` is the KV group a query head reads (GQA/MQA), so
heads of one group share ``W_K`` (as destinations) and ``W_V`` (as sources).

What is folded in, as TransformerLens folds its LayerNorm weights (``fold_ln``, ``center_writing_weights``):

* the destination layer's pre-attention norm gain, as ``diag(gain)`` on the input side of ``W_Q`` and
  ``W_K``; when that norm is a LayerNorm (it subtracts the mean), its centring too, on the input side
  of ``W_Q``/``W_K`` and on the output side of the source's ``W_O`` (the part of a write along the
  all-ones direction is removed by the reader's norm, so it counts in neither norm);
* a post-attention norm's gain on the source's ``W_O`` (Gemma 2/3's ``post_attention_layernorm``,
  OLMo 2's), and its centring if it is a LayerNorm;
* per-head q/k norms (Gemma 3, Qwen 3, OLMo 2's whole-projection ``q_norm``/``k_norm``, Phi's
  ``q_layernorm``): per-dimension gains after the projection, so they fold into the output side of
  ``W_Q``/``W_K``.

What is left out: every norm's statistic (a positive per-token scalar), biases, RoPE (as
TransformerLens does: the rotation depends on the two positions, so the weights alone have no single
``W_QK``), and scalars (attention scaling, Granite's multipliers), which a normalised score does not
see. Post-norm blocks (BERT) fold nothing: their attention reads the previous block's normalised
output. A score whose denominator is 0 (a head that writes nothing, a KV group whose keys are
zero) is 0.

Nothing ``d_model x d_model`` is formed. A matrix ``A = Q_A R_A`` (reduced QR, orthonormal ``Q_A``)
has ``||A X||_F = ||R_A X||_F``, so with ``W_V[g] = Q_V R_V`` the source becomes the thin factor
``S = R_V @ W_O[h1]`` ``[d_head, d_model]``, and with ``W_K[g] = Q_K R_K`` (``W_Q[h] = Q_Q R_Q``) the
destination becomes ``T_q = W_Q[h2] @ R_K^T`` (``T_k = W_K[g] @ R_Q^T``) ``[d_model, d_head]``. Then
``||W_OV||_F = ||S||_F``, ``||W_QK||_F = ||T||_F`` and ``||W_OV W_QK||_F = ||S T_q||_F``: one
``[H * d_head, d_model] @ [d_model, n * 2 * d_head]`` product per (source layer, destination layer),
in float64.

Only separate query and key projections are read (``q_proj``/``k_proj`` of Llama, Gemma, Qwen,
Mistral, OLMo; BERT-style ``query``/``key`` in ``.self``; DistilBERT's ``q_lin``/``k_lin``). Fused
layouts (GPT-2's ``c_attn``, ``qkv_proj``, ``query_key_value``, ``Wqkv``) and multi-head latent
attention raise :class:`~headscope.models.projections.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from headscope.capture.dla import FrozenNorm
from headscope.capture.sources import qk_layout
from headscope.errors import InputError, RunFailure
from headscope.models import anatomy, projections
from headscope.models.projections import Unsupported

Pair = tuple[int, int]
Scores = dict[Pair, dict[Pair, tuple[float, float]]]

# Separate query and key projections: Llama and kin, BERT-style (inside ``.self``), DistilBERT.
QUERY_KEY_NAMES = (("q_proj", "k_proj"), ("query", "key"), ("q_lin", "k_lin"))
# Norms applied to the projected queries and keys (per head, or over the whole projection).
QUERY_NORM_NAMES = ("q_norm", "q_layernorm")
KEY_NORM_NAMES = ("k_norm", "k_layernorm")
FUSED_NAMES = ("qkv_proj", "c_attn", "query_key_value", "Wqkv", "W_pack")
# Source factors kept between destination layers up to this size (float64), recomputed beyond it.
_CACHE_BYTES = 256 << 20


def composition_scores(loaded: Any, dest: Sequence[Pair]) -> Scores:
    """Q- and K-composition of every head of every earlier attention layer with each destination head.

    Returns ``{(layer, head): {(src_layer, src_head): (q_composition, k_composition)}}`` for each
    destination in ``dest``; a destination in the first attention layer maps to ``{}``. Scores lie in
    ``[0, 1]``; compare them with :func:`random_baseline`, the score of random matrices of the same
    shapes.
    """
    layout = loaded.layout
    attention_layers = list(layout.attention_layers)
    wanted: dict[int, list[int]] = {}
    for pair in dest:
        layer, head = int(pair[0]), int(pair[1])
        if layer not in attention_layers:
            raise InputError(f"layer {layer} is not an attention layer of {loaded.name}")
        if not 0 <= head < layout.n_heads:
            raise InputError(f"head {head} is out of range: layer {layer} has {layout.n_heads} heads")
        heads = wanted.setdefault(layer, [])
        if head not in heads:
            heads.append(head)
    weights = _Weights(loaded)
    out: Scores = {(layer, head): {} for layer, heads in wanted.items() for head in heads}
    for layer in sorted(wanted):
        heads = wanted[layer]
        reader = weights.reader(layer, heads)  # [n, 2, D, r]
        centred = weights.centred(layer)
        n, _, d_model, rank = reader.shape
        right = reader.permute(2, 0, 1, 3).reshape(d_model, n * 2 * rank)
        right_norms = reader.pow(2).sum((2, 3)).sqrt()  # [n, 2]
        for source in (i for i in attention_layers if i < layer):
            writer = weights.writer(source, centred)  # [H, r', D]
            n_src, rank_src, _ = writer.shape
            product = (writer.reshape(n_src * rank_src, d_model) @ right).reshape(n_src, rank_src, n, 2, rank)
            numerator = product.pow(2).sum((1, 4)).sqrt()  # [H, n, 2]
            left_norms = writer.pow(2).sum((1, 2)).sqrt()  # [H]
            scores = _ratio(numerator, left_norms[:, None, None] * right_norms[None])
            for j, head in enumerate(heads):
                row = out[(layer, head)]
                for h in range(n_src):
                    row[(source, h)] = (float(scores[h, j, 0]), float(scores[h, j, 1]))
    return out


def random_baseline(loaded: Any, *, draws: int = 32, seed: int = 0) -> tuple[float, float]:
    """Elhage et al.'s baseline: the mean (Q, K) composition score of independent standard Gaussian
    ``W_V, W_O, W_Q, W_K`` of the model's shapes (``d_model``, value and query/key head dims), over
    ``draws`` draws of a seeded generator. Q and K have the same expectation; both are returned."""
    layout = loaded.layout
    d_model, d_value, d_head = layout.d_model, layout.v_head_dim, layout.head_dim
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    w_v, w_o = normal(draws, d_model, d_value), normal(draws, d_value, d_model)
    w_q, w_k = normal(draws, d_model, d_head), normal(draws, d_model, d_head)
    writer = _thin(w_v) @ w_o  # [draws, r, D]
    reader = torch.stack([w_q @ _thin(w_k).mT, w_k @ _thin(w_q).mT], 1)  # [draws, 2, D, r]
    numerator = (writer[:, None] @ reader).pow(2).sum((2, 3)).sqrt()  # [draws, 2]
    denominator = writer.pow(2).sum((1, 2)).sqrt()[:, None] * reader.pow(2).sum((2, 3)).sqrt()
    mean = _ratio(numerator, denominator).mean(0)
    return float(mean[0]), float(mean[1])


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator``, 0 where the denominator is 0, at most 1 (float rounding)."""
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return torch.where(denominator > 0, numerator / safe, torch.zeros_like(numerator)).clamp(max=1.0)


def _thin(matrix: torch.Tensor) -> torch.Tensor:
    """``R`` of the reduced QR ``matrix = Q R`` ``[.., min(m, n), n]``: ``||matrix X|| = ||R X||``."""
    return torch.linalg.qr(matrix, mode="r").R


def _float(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(device="cpu", dtype=torch.float64)


class _Weights:
    """The model's folded per-head factors, read layer by layer."""

    def __init__(self, loaded: Any) -> None:
        self.layout = loaded.layout
        self.config = anatomy.text_config(loaded.model.config)
        self.blocks = anatomy.blocks(loaded.model)
        self._writers: dict[tuple[int, bool], torch.Tensor] = {}
        self._cached = 0
        self._inputs: dict[int, tuple[torch.Tensor | None, bool]] = {}

    def centred(self, layer: int) -> bool:
        return self._input_norm(layer)[1]

    def writer(self, layer: int, centred: bool) -> torch.Tensor:
        """``S = R_V[g(h)] @ W_O[h]`` per query head ``[H, r, D]``, post-norm gain (and centring) folded."""
        key = (layer, centred)
        found = self._writers.get(key)
        if found is not None:
            return found
        block = self.blocks[layer]
        attention = projections.attention_module(block)
        path = projections.value_path(attention, self.config)
        if path.linear is None:
            raise Unsupported(
                f"{type(attention).__name__}: the value path is not linear (latent attention or clipped "
                "qkv), so a head has no W_OV matrix to compose"
            )
        w_v = _float(path.linear)  # [kv, D, Dv]
        w_o = _float(projections.output_projection(attention, self.layout.n_heads)[0])  # [H, Dv, D]
        post = anatomy.post_attention_norm(block)
        if post is not None:
            frozen = FrozenNorm.of(post, f"post-attention norm of layer {layer}")
            w_o = w_o * frozen.gain
            if frozen.centred:
                w_o = w_o - w_o.mean(-1, keepdim=True)
        if centred:
            w_o = w_o - w_o.mean(-1, keepdim=True)
        groups = torch.arange(w_o.shape[0]) // (w_o.shape[0] // path.kv_heads)
        found = (_thin(w_v)[groups] @ w_o).contiguous()
        size = found.numel() * found.element_size()
        if self._cached + size <= _CACHE_BYTES:
            self._writers[key] = found
            self._cached += size
        return found

    def reader(self, layer: int, heads: list[int]) -> torch.Tensor:
        """``[n, 2, D, r]``: per destination head, ``T_q = W_Q[h] @ R_K[g]^T`` and ``T_k = W_K[g] @ R_Q[h]^T``."""
        w_q, w_k = self.query_key(layer)  # [H, D, dk], [kv, D, dk]
        index = torch.tensor(heads)
        groups = index // (w_q.shape[0] // w_k.shape[0])
        queries, keys = w_q[index], w_k[groups]
        return torch.stack([queries @ _thin(keys).mT, keys @ _thin(queries).mT], 1)

    def query_key(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Folded ``W_Q`` ``[H, D, dk]`` and ``W_K`` ``[kv, D, dk]`` of the layer (row vectors: ``x @ W``)."""
        attention = projections.attention_module(self.blocks[layer])
        heads = self.layout.n_heads
        try:
            holder, q_proj, k_proj = _query_key_modules(attention)
            q_rows, k_rows = projections._rows(q_proj), projections._rows(k_proj)  # [out, D]
        except Unsupported:
            # Fused q/k/v projections (GPT-2, Phi-3, GPT-NeoX, Persimmon): the rows qk reads.
            found = qk_layout(attention, heads)
            if not found.fused_width:
                raise
            q_rows, _, k_rows, _ = found.weights(attention)
            holder = attention
        if q_rows.shape[0] % heads:
            raise RunFailure(
                f"{type(attention).__name__}: {q_rows.shape[0]} query rows are not {heads} heads"
            )
        d_head = q_rows.shape[0] // heads
        if d_head != self.layout.head_dim or k_rows.shape[0] % d_head:
            raise Unsupported(
                f"{type(attention).__name__}: q/k projections of {q_rows.shape[0]} and {k_rows.shape[0]} rows "
                f"are not {heads} query heads and whole KV heads of head dim {self.layout.head_dim}"
            )
        kv = k_rows.shape[0] // d_head
        if heads % kv:
            raise RunFailure(
                f"{type(attention).__name__}: {heads} query heads do not split into {kv} KV groups"
            )
        w_q = _float(q_rows).reshape(heads, d_head, -1).mT  # [H, D, dk]
        w_k = _float(k_rows).reshape(kv, d_head, -1).mT  # [kv, D, dk]
        w_q = _fold_head_norm(w_q, holder, QUERY_NORM_NAMES, f"query norm of layer {layer}")
        w_k = _fold_head_norm(w_k, holder, KEY_NORM_NAMES, f"key norm of layer {layer}")
        gain, centred = self._input_norm(layer)
        if gain is not None:
            w_q, w_k = w_q * gain[:, None], w_k * gain[:, None]
        if centred:
            w_q = w_q - w_q.mean(1, keepdim=True)
            w_k = w_k - w_k.mean(1, keepdim=True)
        return w_q, w_k

    def _input_norm(self, layer: int) -> tuple[torch.Tensor | None, bool]:
        """The layer's pre-attention norm as (gain ``[D]`` or None, whether it centres)."""
        found = self._inputs.get(layer)
        if found is None:
            norm = projections.input_norm(self.blocks[layer])
            if norm is None:
                found = (None, False)
            elif getattr(norm, "weight", None) is None:  # OLMo's LayerNorm without parameters
                found = (None, _centres(norm, self.layout.d_model))
            else:
                frozen = FrozenNorm.of(norm, f"input norm of layer {layer}")
                found = (frozen.gain, frozen.centred)
            self._inputs[layer] = found
        return found


def _query_key_modules(attention: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    """(the module holding them, the query projection, the key projection)."""
    projections._refuse(attention)
    if isinstance(getattr(attention, "kv_b_proj", None), nn.Module):
        raise Unsupported(
            f"{type(attention).__name__}: multi-head latent attention's keys pass a norm and a decompression; "
            "composition scores need linear W_Q and W_K"
        )
    for holder in (attention, getattr(attention, "self", None)):
        if not isinstance(holder, nn.Module):
            continue
        for q_name, k_name in QUERY_KEY_NAMES:
            q_proj, k_proj = getattr(holder, q_name, None), getattr(holder, k_name, None)
            if projections._is_projection(q_proj) and projections._is_projection(k_proj):
                return holder, q_proj, k_proj
    fused = next(
        (name for name in FUSED_NAMES if isinstance(getattr(attention, name, None), nn.Module)), None
    )
    if fused is not None:
        raise Unsupported(
            f"{type(attention).__name__}: fused query/key projection {fused!r}; composition scores read "
            "separate q/k projections only for now"
        )
    raise Unsupported(f"{type(attention).__name__}: no separate query and key projections found")


def _fold_head_norm(weight: torch.Tensor, holder: nn.Module, names: Sequence[str], what: str) -> torch.Tensor:
    """``weight`` ``[heads, D, dk]`` with the gain (and centring) of a norm on the projected queries/keys
    folded into its output side. Norms without a gain (Llama 4's L2 norm) fold nothing."""
    norm = next((getattr(holder, n) for n in names if isinstance(getattr(holder, n, None), nn.Module)), None)
    if norm is None or getattr(norm, "weight", None) is None:
        return weight
    heads, _, d_head = weight.shape
    if norm.weight.dim() != 1 or norm.weight.numel() not in (d_head, heads * d_head):
        raise Unsupported(
            f"the {what} has a gain of shape {tuple(norm.weight.shape)}, not per head dimension"
        )
    frozen = FrozenNorm.of(norm, what)
    if frozen.centred and norm.weight.numel() != d_head and heads > 1:
        raise Unsupported(f"the {what} centres across heads, which mixes them")
    if frozen.centred:
        weight = weight - weight.mean(-1, keepdim=True)
    return weight * frozen.gain.reshape(-1, 1, d_head)


def _centres(norm: nn.Module, dim: int) -> bool:
    """Whether a norm without parameters subtracts the mean (shifting every entry leaves it unchanged)."""
    probe = torch.randn(3, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2.0
    with torch.no_grad():
        return bool(torch.allclose(norm(probe).double(), norm(probe + 3.0).double(), rtol=1e-3, atol=1e-3))
