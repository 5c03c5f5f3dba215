"""Where the parts of a Hugging Face model are, found through the model's own API and config.

The blocks are the ``ModuleList`` of ``num_hidden_layers`` modules under the model's decoder
(``get_decoder()``, else ``base_model``); the LM head is ``get_output_embeddings()``; the final norm
is the decoder's norm child that is not an embedding norm. Scalars that sit between the parts
(Granite's ``residual_multiplier`` and ``logits_scaling``, Cohere's ``logit_scale``, Gemma's
``final_logit_softcapping``) come from the config.

Nothing here is trusted on its own: :mod:`headscope.capture.checks` runs the model and refuses a
decomposition (DLA, OV) whose parts, put back together, do not reproduce it.
"""

from __future__ import annotations

from typing import Any

import torch

from headscope.errors import RunFailure


def text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def base_model(model: Any) -> Any:
    """The model without its head: ``base_model``, or, where that names the model itself (Llama 4
    text, whose ``base_model_prefix`` is not its attribute), its one inner pretrained model."""
    base = getattr(model, "base_model", model)
    if base is model:
        from transformers import PreTrainedModel

        inner = [child for child in model.children() if isinstance(child, PreTrainedModel)]
        if len(inner) == 1:
            return inner[0]
    return base


def decoder(model: Any) -> torch.nn.Module:
    """The module that holds the blocks: the decoder of a causal LM, the encoder model itself."""
    getter = getattr(model, "get_decoder", None)
    if getter is not None:
        try:
            found = getter()
        except (AttributeError, ValueError, NotImplementedError):
            found = None
        # get_decoder() can name a head's Linear called "decoder" (ModernBERT's MLM head): the
        # decoder must hold the blocks.
        if (
            isinstance(found, torch.nn.Module)
            and found is not model
            and any(isinstance(m, torch.nn.ModuleList) for m in found.modules())
        ):
            return found
    return base_model(model)


def blocks(model: Any) -> list[torch.nn.Module]:
    """The model's ``num_hidden_layers`` blocks, in order: the shallowest ``ModuleList`` of that length."""
    n_layers = int(text_config(model.config).num_hidden_layers)
    root = base_model(model)
    candidates = [
        (name.count("."), name, module)
        for name, module in root.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers
    ]
    if not candidates:
        raise RunFailure(f"cannot find the {n_layers} blocks of {type(model).__name__}")
    return list(min(candidates, key=lambda c: (c[0], c[1]))[2])


def is_norm(module: torch.nn.Module) -> bool:
    """A LayerNorm or RMSNorm-like module: a gain vector (and maybe a bias), nothing else."""
    params = list(module.parameters(recurse=False))
    if isinstance(module, torch.nn.LayerNorm | torch.nn.GroupNorm):
        return True
    name = type(module).__name__.lower()
    return bool(params) and all(p.dim() == 1 for p in params) and "norm" in name


def final_norm(model: Any) -> torch.nn.Module:
    """The norm between the last block and the LM head: the decoder's last norm child that is not an
    embedding norm (Bloom's ``word_embeddings_layernorm``, Falcon's none)."""
    root = decoder(model)
    norms = [
        module
        for name, module in root.named_children()
        if is_norm(module) and "emb" not in name.lower() and not isinstance(module, torch.nn.ModuleList)
    ]
    if not norms:
        raise RunFailure(
            f"cannot find the final norm of {type(model).__name__}; direct logit attribution needs it"
        )
    return norms[-1]


def lm_head(model: Any) -> torch.nn.Module:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "weight", None) is None:
        raise RunFailure("direct logit attribution needs a language model with an LM head")
    return head


def post_attention_norm(block: torch.nn.Module) -> torch.nn.Module | None:
    """The norm applied to the attention output before the residual add, if the block has one.

    Blocks that normalise each sublayer's output (Gemma 2/3 "sandwich" norms, OLMo 2's post-norms)
    have a ``post_feedforward_layernorm``; in them ``post_attention_layernorm`` normalises the
    attention output. In Llama-style blocks the same name is the MLP's *input* norm instead.
    """
    if hasattr(block, "post_feedforward_layernorm") and hasattr(block, "post_attention_layernorm"):
        return block.post_attention_layernorm
    return None


def residual_multiplier(config: Any) -> float:
    """What each sublayer's output is multiplied by before the residual add (Granite)."""
    return float(getattr(text_config(config), "residual_multiplier", None) or 1.0)


def logit_multiplier(config: Any) -> float:
    """What the LM head's output is multiplied by: Cohere's ``logit_scale``, Granite's ``1 / logits_scaling``."""
    text = text_config(config)
    scale = getattr(text, "logit_scale", None)
    factor = float(scale) if isinstance(scale, int | float) else 1.0
    scaling = getattr(text, "logits_scaling", None)
    if isinstance(scaling, int | float) and scaling:
        factor /= float(scaling)
    return factor


def final_softcap(config: Any) -> float | None:
    cap = getattr(text_config(config), "final_logit_softcapping", None)
    return float(cap) if cap else None


def frozen_modules(block: torch.nn.Module, attention: torch.nn.Module) -> list[torch.nn.Module]:
    """The block's modules outside ``attention`` that own a weight matrix: the MLP's (or experts')
    projections. Holding their outputs fixed isolates what the attention output adds directly."""
    inside = {id(m) for m in attention.modules()}
    return [
        module
        for module in block.modules()
        if id(module) not in inside and any(p.dim() >= 2 for p in module.parameters(recurse=False))
    ]
