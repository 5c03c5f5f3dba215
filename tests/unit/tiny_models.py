"""Tiny random models that several unit tests share (DLA, path patching, the checks, selective rows).

Each builder seeds torch, so it returns the same weights every time. Not a test module (no
``test_`` prefix): tests import it as ``from tiny_models import tiny_llama``.
"""

from __future__ import annotations

import torch
from conftest import word_tokenizer

import headscope as hs
from headscope.models import LoadedModel


def loaded_tiny(model, config) -> LoadedModel:
    loaded = hs.load(model, word_tokenizer(config.vocab_size), capture="stream", name="tiny")
    assert loaded.capture_mode == "stream"
    return loaded


def tiny_llama(*, sharp: bool = False) -> LoadedModel:
    """A tiny random Llama (GQA: 4 query heads, 2 KV heads, 3 layers, untied unembedding).

    By default its norm gains are random and its attention projections have random biases, so
    that folding them in is tested (DLA). ``sharp``: no biases, and weights large enough that one
    head's write moves another's attention by more than float noise (path patching)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        **({"initializer_range": 0.4} if sharp else {"attention_bias": True}),
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    if not sharp:
        with torch.no_grad():
            for module in model.modules():
                if type(module).__name__.endswith("RMSNorm"):
                    module.weight.uniform_(0.5, 1.5)
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.normal_(0, 0.1)
    return loaded_tiny(model, config)


def tiny_gemma() -> LoadedModel:
    """A tiny random Gemma 3 (MQA, sliding window 4 in two of its three layers, random norm gains)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm") and module.weight.dim() == 1:
                module.weight.uniform_(-0.5, 0.5)  # Gemma scales by 1 + w
    return loaded_tiny(model, config)


def tiny_gpt2() -> LoadedModel:
    """A tiny random GPT-2 (LayerNorm with random gains and biases, Conv1D projections)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50, n_embd=32, n_layer=3, n_head=4, n_positions=64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)
    return loaded_tiny(model, config)


def tiny_bert() -> LoadedModel:
    """A tiny random BERT encoder: no LM head, not causal."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return hs.load(BertModel(config).eval(), word_tokenizer(40), name="tiny-bert")
