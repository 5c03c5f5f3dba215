"""Each attention module's per-head value path and output projection, read from its family's code.

Head decomposition needs two things from every attention module: ``W_V`` (what a source token
writes into each KV head's value vector) and ``W_O`` (how each head's output vector lands in the
residual stream). transformers lays these out differently per family, and each layout here is
read from ``modeling_<family>.py``:

* separate value projections: ``v_proj`` (Llama and its kin, OPT, XGLM, GPT-J, GPT-Neo),
  ``value`` (BERT, RoBERTa, ELECTRA, ALBERT), ``v_lin`` (DistilBERT);
* fused projections whose value rows sit at family-specific offsets: GPT-2's ``Conv1D`` ``c_attn``
  (q | k | v), GPT-BigCode's ``c_attn`` (multi-query: q | one k | one v; else per head q, k, v),
  Phi-3's ``qkv_proj`` (q | k | v with GQA), CodeGen's ``qkv_proj`` (four model-parallel shards,
  each q | v | k), ``query_key_value`` (GPT-NeoX, Persimmon, Bloom: per head q, k, v; Falcon:
  grouped per KV head, multi-query or per head), ``Wqkv`` (MPT, ModernBERT: q | k | v);
* DeepSeek-V3's multi-head latent attention, whose value path is not linear: the input goes
  through ``kv_a_proj_with_mqa``, loses its rotary part, is RMS-normalised by ``kv_a_layernorm``
  and expanded by ``kv_b_proj`` into each head's ``[k_nope | v]``.

Every fused layout reduces to the rows of one ``[out, d_model]`` weight that hold each KV head's
value, so one gather serves them all. Where a family's head output is not ``value @ W_O`` (the
differential attention of DiffLlama, the output gate of Qwen3-Next), :class:`Unsupported` says so
rather than hand back weights whose product is not the module's computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from headscope.errors import RunFailure


class Unsupported(RunFailure):
    """The attention module's computation has no per-head ``value @ W_O`` decomposition."""


# The names blocks give their attention module, in transformers' families.
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")
# Pre-attention norms: the norm whose output is the attention module's input.
PRE_NORM_NAMES = ("input_layernorm", "ln_1", "ln_attn", "attention_norm", "norm_1", "attn_norm")
# Norms a block may hold that are not applied before attention: pre-MLP norms, post-norms.
OTHER_NORM_NAMES = frozenset(
    {
        "post_attention_layernorm",
        "post_feedforward_layernorm",
        "pre_feedforward_layernorm",
        "pre_ff_layernorm",
        "ln_2",
        "norm_2",
        "ln_mlp",
        "mlp_norm",
        "sa_layer_norm",
        "output_layer_norm",
        "full_layer_layer_norm",
        "final_layer_norm",
    }
)
# Blocks whose ``self_attn_layer_norm`` is a pre-norm (in BART and Marian the same name is a post-norm).
PRE_SELF_ATTN_LAYER_NORM = frozenset({"XGLMDecoderLayer"})
# The output projection's name inside the attention module.
OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj", "out_lin", "Wo")
# Separate value projections: Llama and kin, BERT-style (inside ``.self``), DistilBERT.
VALUE_NAMES = ("v_proj", "value", "v_lin")
# Separate query, key and value projections, as paths inside the attention module: Llama and kin,
# BERT and kin (inside ``.self``), DistilBERT.
SEPARATE_QKV = (
    ("q_proj", "k_proj", "v_proj"),
    ("self.query", "self.key", "self.value"),
    ("q_lin", "k_lin", "v_lin"),
)
DIFFERENTIAL_REASON = (
    "differential attention: a head's output is the difference of two softmax maps, normalised per "
    "head (subln); a single-head OV circuit is not the module's computation"
)


def attention_module(block: nn.Module) -> nn.Module:
    """The block's self-attention module: the one that holds (or, BERT-style, contains) the projections.

    GPT-Neo wraps its attention in a dispatcher (``block.attn.attention`` holds the projections);
    BERT-style ``attention`` modules hold the value projection in ``.self`` and the output
    projection in ``.output``, and are returned whole because their output is what the block adds.
    """
    for name in ATTENTION_NAMES:
        module = getattr(block, name, None)
        if not isinstance(module, nn.Module):
            continue
        inner = getattr(module, "attention", None)
        if isinstance(inner, nn.Module) and _find_output(module) is None:
            return inner
        return module
    children = ", ".join(name for name, _ in block.named_children())
    raise RunFailure(
        f"{type(block).__name__} has no attention module (children: {children}); "
        "a hybrid's recurrent or linear-attention layers have none"
    )


def input_norm(block: nn.Module) -> nn.Module | None:
    """The norm the block applies to the residual stream before attention; None when attention reads it raw.

    None for post-norm blocks (BERT, ALBERT, DistilBERT, OPT-350m), OLMo 2 (it normalises the
    attention output instead) and ModernBERT's first layer (an ``Identity``). Falcon's new
    architecture has ``ln_attn`` when it keeps two parallel norms, ``input_layernorm`` otherwise.
    """
    for name in PRE_NORM_NAMES:
        module = getattr(block, name, None)
        if isinstance(module, nn.Module):
            return None if isinstance(module, nn.Identity) else module
    norms = {name: child for name, child in block.named_children() if "norm" in type(child).__name__.lower()}
    shared = norms.pop("self_attn_layer_norm", None)
    if shared is not None:  # XGLM: pre-norm; OPT: pre-norm unless do_layer_norm_before is False (350m)
        if type(block).__name__ in PRE_SELF_ATTN_LAYER_NORM or getattr(block, "do_layer_norm_before", False):
            return shared
        if getattr(block, "do_layer_norm_before", None) is None:
            raise Unsupported(
                f"{type(block).__name__}: self_attn_layer_norm is a pre-norm in some families and a "
                "post-norm in others, and this block is not known to be either"
            )
    unknown = sorted(set(norms) - OTHER_NORM_NAMES)
    if unknown:
        raise Unsupported(
            f"{type(block).__name__}: cannot tell whether {', '.join(unknown)} precede attention"
        )
    return None


def separate_qkv(attention: nn.Module) -> tuple[str, str, str] | None:
    """The paths of the attention module's separate query, key and value projections (the value's
    may be absent), or None where they are fused (or not linear layers). A peft adapter layer over a
    linear layer (LoRA and kin) is one: it is still affine in its input (:func:`_effective`)."""
    for names in SEPARATE_QKV:
        query, key = (_submodule(attention, name) for name in names[:2])
        if _is_linear(query) and _is_linear(key):
            return names
    return None


def _is_linear(module: object) -> bool:
    return isinstance(module, nn.Linear) or isinstance(_adapted(module), nn.Linear)


def _submodule(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def output_module(attention: nn.Module) -> nn.Module:
    """The ``Linear`` or ``Conv1D`` whose input is the heads' concatenated outputs ``[.., heads * v_head_dim]``."""
    _refuse(attention)
    if getattr(attention, "pretraining_tp", 1) > 1 and getattr(attention, "slow_but_exact", False):
        raise Unsupported(
            "Bloom with pretraining_tp > 1 and slow_but_exact applies dense's weight slice by slice, "
            "without its bias and without calling the module"
        )
    found = _find_output(attention)
    if found is None:
        raise RunFailure(f"cannot find the output projection of {type(attention).__name__}")
    return found


def output_projection(attention: nn.Module, n_heads: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``W_O`` as ``[heads, v_head_dim, d_model]`` (head ``h`` writes ``out[h] @ W_O[h]``) and its bias."""
    proj = output_module(attention)
    weight = _rows(proj)  # [d_model, heads * v_head_dim]
    inner = weight.shape[1]
    if inner % n_heads:
        raise RunFailure(
            f"{type(attention).__name__}: output projection input {inner} is not {n_heads} heads"
        )
    w_o = weight.T.reshape(n_heads, inner // n_heads, weight.shape[0])
    return w_o, _bias(proj)


@dataclass
class ValuePath:
    """What a (normalised) source token writes into each KV head's value vector.

    ``linear`` is ``W_V`` as ``[kv_heads, d_model, v_head_dim]`` (row vectors: ``x @ W_V[g]``) and
    ``bias`` its ``[kv_heads, v_head_dim]`` bias, when the path is linear. When it is not (multi-head
    latent attention, MPT's clipped qkv) ``linear`` and ``bias`` are None and calling the path runs
    the module's own layers. Query head ``h`` reads KV head ``h // (heads // kv_heads)``.
    """

    linear: torch.Tensor | None
    bias: torch.Tensor | None
    kv_heads: int
    head_dim: int
    nonlinear: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, repr=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The value vectors ``[.., kv_heads, v_head_dim]`` of inputs ``x`` ``[.., d_model]``."""
        if self.nonlinear is not None:
            return self.nonlinear(x)
        assert self.linear is not None
        values = torch.einsum("...d,gde->...ge", x, self.linear)
        return values if self.bias is None else values + self.bias


def value_path(attention: nn.Module, config: object) -> ValuePath:
    """The attention module's value path, from its family's layout; ``config`` is the text config."""
    _refuse(attention)
    heads = _query_heads(config)
    d_head = _rows(output_module(attention)).shape[1] // heads  # the value head dim, from W_O's input
    query = getattr(attention, "q_proj", None)
    if isinstance(getattr(attention, "kv_b_proj", None), nn.Linear):
        return _latent(attention)
    if isinstance(query, nn.Linear) and query.out_features == 2 * heads * d_head:
        raise Unsupported(
            f"{type(attention).__name__}: gated attention: q_proj also yields a per-head gate that "
            "scales each head's output by sigmoid(gate(destination)) before o_proj, so value @ W_O "
            "is not what the head writes"
        )
    proj, rows = _value_rows(attention, heads, d_head)
    weight = _rows(proj)  # [out, d_model]
    bias = _bias(proj)
    w_v = weight[rows].transpose(1, 2).contiguous()  # [kv, d_model, d_head]
    b_v = bias[rows] if bias is not None else None
    path = ValuePath(w_v, b_v, rows.shape[0], d_head)
    clip = getattr(attention, "clip_qkv", None)
    if not clip:
        return path

    def clipped(x: torch.Tensor) -> torch.Tensor:
        return path(x).clamp(min=-clip, max=clip)

    return ValuePath(None, None, rows.shape[0], d_head, clipped)


def _refuse(attention: nn.Module) -> None:
    """Raise Unsupported for attention whose heads do not write ``value @ W_O``."""
    if hasattr(attention, "lambda_q1"):
        raise Unsupported(f"{type(attention).__name__}: {DIFFERENTIAL_REASON}")


def _is_projection(module: object) -> bool:
    if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
        return True
    return _adapted(module) is not None


def _adapted(module: object) -> nn.Module | None:
    """The projection a peft adapter layer (LoRA, DoRA, IA³, …) wraps, or None for anything else."""
    base = getattr(module, "base_layer", None)
    if isinstance(module, nn.Module) and base is not None and _is_projection(base):
        return base
    return None


def _rows(proj: nn.Module) -> torch.Tensor:
    """The projection's weight as ``[out, in]`` (``Conv1D`` stores ``[in, out]``), detached. For an
    adapter layer, the weight the layer applies now, adapters included (:func:`_effective`)."""
    if _adapted(proj) is not None:
        return _effective(proj)[0]
    weight = proj.weight.detach()
    return weight if isinstance(proj, nn.Linear) else weight.T


def _bias(proj: nn.Module) -> torch.Tensor | None:
    if _adapted(proj) is not None:
        return _effective(proj)[1]
    return proj.bias.detach() if getattr(proj, "bias", None) is not None else None


def _effective(proj: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(W [out, in], b)`` of an adapter layer as it computes now: the base projection plus its
    active adapters (W + scale · B·A for LoRA; DoRA's and IA³'s rescalings too; nothing for disabled
    or merged ones). Read by running the layer on the identity and on zero, which gives the affine
    map exactly for any adapter that is affine in its input (every peft adapter in eval mode, where
    adapter dropout is off), without knowing the adapter's formula."""
    base = _adapted(proj)
    assert base is not None
    weight = base.weight
    inputs = weight.shape[1] if isinstance(base, nn.Linear) else weight.shape[0]
    with torch.no_grad():
        probe = torch.eye(inputs, dtype=weight.dtype, device=weight.device)
        at_zero = proj(torch.zeros(1, inputs, dtype=weight.dtype, device=weight.device))
        columns = proj(probe) - at_zero  # row i: W @ e_i
    has_bias = getattr(base, "bias", None) is not None or bool(at_zero.abs().max() > 0)
    return columns.T.contiguous(), (at_zero[0] if has_bias else None)


def _find_output(attention: nn.Module) -> nn.Module | None:
    for name in OUTPUT_NAMES:
        module = getattr(attention, name, None)
        if _is_projection(module):
            return module
    dense = getattr(getattr(attention, "output", None), "dense", None)  # BERT-style BertSelfOutput
    return dense if _is_projection(dense) else None


def _query_heads(config: object) -> int:
    for name in ("num_attention_heads", "n_heads", "n_head", "num_heads"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise RunFailure(f"{type(config).__name__} names no number of attention heads")


def _grid(kv: int, d_head: int, start: int, stride: int) -> torch.Tensor:
    """Row indices ``[kv, d_head]``: KV head ``g``'s value starts at ``start + g * stride``."""
    return start + stride * torch.arange(kv)[:, None] + torch.arange(d_head)[None, :]


def _value_rows(attention: nn.Module, heads: int, d_head: int) -> tuple[nn.Module, torch.Tensor]:
    """The projection that computes the values and, per KV head, which of its output rows they are."""
    width = heads * d_head
    for holder in (attention, getattr(attention, "self", None)):  # BERT keeps the value in .self
        for name in VALUE_NAMES:
            proj = getattr(holder, name, None)
            if _is_projection(proj):
                kv = _rows(proj).shape[0] // d_head
                return proj, _grid(kv, d_head, 0, d_head)
    qkv = getattr(attention, "qkv_proj", None)
    if _is_projection(qkv):
        out = _rows(qkv).shape[0]
        shards = getattr(attention, "mp_num", None)
        if shards is not None:
            # CodeGen: the output is [shards, 3 * local] with each shard q | v | k; the values of the
            # shards, concatenated, are the heads' values.
            local = width // shards
            flat = torch.arange(width)
            rows = (flat // local) * 3 * local + local + flat % local
            return qkv, rows.reshape(heads, d_head)
        kv = (out - width) // (2 * d_head)  # Phi-3: q | k | v, k and v kv heads each
        return qkv, _grid(kv, d_head, width + kv * d_head, d_head)
    c_attn = getattr(attention, "c_attn", None)
    if _is_projection(c_attn):
        if getattr(attention, "is_cross_attention", False):
            raise Unsupported(
                f"{type(attention).__name__}: cross-attention reads its values from the encoder"
            )
        if getattr(attention, "multi_query", None) is True:  # GPT-BigCode MQA: q | k | v, one kv head
            return c_attn, _grid(1, d_head, width + d_head, d_head)
        if hasattr(attention, "multi_query"):  # GPT-BigCode MHA: per head q, k, v
            return c_attn, _grid(heads, d_head, 2 * d_head, 3 * d_head)
        return c_attn, _grid(heads, d_head, 2 * width, d_head)  # GPT-2: q | k | v
    fused = getattr(attention, "query_key_value", None)
    if _is_projection(fused):
        if getattr(attention, "new_decoder_architecture", False):
            # Falcon: [kv, group + 2, d_head], each KV group's queries, then its k, then its v.
            kv = (_rows(fused).shape[0] // d_head - heads) // 2
            group = heads // kv
            return fused, _grid(kv, d_head, (group + 1) * d_head, (group + 2) * d_head)
        if getattr(attention, "multi_query", False):  # Falcon MQA: [heads + 2, d_head]
            return fused, _grid(1, d_head, width + d_head, d_head)
        # GPT-NeoX, Persimmon, Bloom, Falcon's old multi-head layout: [heads, 3, d_head].
        return fused, _grid(heads, d_head, 2 * d_head, 3 * d_head)
    wqkv = getattr(attention, "Wqkv", None)
    if _is_projection(wqkv):  # MPT, ModernBERT: q | k | v
        return wqkv, _grid(heads, d_head, 2 * width, d_head)
    raise RunFailure(f"cannot find the value projection of {type(attention).__name__}")


def _latent(attention: nn.Module) -> ValuePath:
    """Multi-head latent attention (DeepSeek): the values through the compressed, normalised latent."""
    rank = attention.kv_lora_rank
    nope, d_head = attention.qk_nope_head_dim, attention.v_head_dim
    heads = attention.kv_b_proj.out_features // (nope + d_head)

    def values(x: torch.Tensor) -> torch.Tensor:
        latent = attention.kv_a_layernorm(attention.kv_a_proj_with_mqa(x)[..., :rank])
        expanded = attention.kv_b_proj(latent).unflatten(-1, (heads, nope + d_head))
        return expanded[..., nope:]

    return ValuePath(None, None, heads, d_head, values)
