"""headscope.models.projections against tiny random models of every supported transformers family.

Each family's model is built from transformers' own config class (two layers, four heads, two KV
heads where the family has GQA), every parameter drawn from N(0, 0.2) so no weight or bias is
trivial, and run in eager attention. Three things are checked on each attention layer:

* one token: with a single key the softmax is 1, so what the output projection writes is
  ``sum_h value_path(x)[g(h)] @ W_O[h] + b_O`` with ``x`` the attention module's actual input;
  where the module returns that write itself (all but the post-norm encoders and Bloom, which add
  the residual inside the module) its output is compared too;
* a multi-token forward: the heads' slices of the output module's input, through ``W_O``, plus
  the bias, are its output;
* ``input_norm(block)`` of the block's input is the attention module's input (the block's input
  itself when there is no pre-norm).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from headscope.errors import RunFailure
from headscope.models.projections import (
    Unsupported,
    attention_module,
    input_norm,
    output_module,
    output_projection,
    value_path,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

SMALL = {"vocab_size": 64, "num_hidden_layers": 2, "intermediate_size": 48}
LLAMA_LIKE = {
    **SMALL,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
BERT_LIKE = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}


def _no_sinks(model: nn.Module) -> None:
    """GPT-OSS's per-head sink logit joins every softmax; at -1e9 a single key gets weight 1 again."""
    for module in model.modules():
        if isinstance(getattr(module, "sinks", None), nn.Parameter):
            module.sinks.data.fill_(-1e9)


@dataclass(frozen=True)
class Family:
    """A tiny model of one family: its config class and arguments, and the class of its blocks."""

    name: str
    config: str
    kwargs: dict[str, Any]
    block: str
    module_output_is_write: bool = True  # False: the module adds the residual or a post-norm itself
    unsupported: str | None = None  # a phrase value_path's Unsupported message must contain
    adjust: Callable[[nn.Module], None] | None = field(default=None, compare=False)


FAMILIES = [
    Family("llama", "LlamaConfig", {**LLAMA_LIKE, "attention_bias": True}, "LlamaDecoderLayer"),
    Family("mistral", "MistralConfig", LLAMA_LIKE, "MistralDecoderLayer"),
    Family(
        "mixtral",
        "MixtralConfig",
        {**LLAMA_LIKE, "num_local_experts": 4, "num_experts_per_tok": 2},
        "MixtralDecoderLayer",
    ),
    Family("qwen2", "Qwen2Config", LLAMA_LIKE, "Qwen2DecoderLayer"),
    Family("qwen3", "Qwen3Config", {**LLAMA_LIKE, "head_dim": 12}, "Qwen3DecoderLayer"),
    Family(
        "qwen3_moe",
        "Qwen3MoeConfig",
        {**LLAMA_LIKE, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
        "Qwen3MoeDecoderLayer",
    ),
    Family("gemma", "GemmaConfig", {**LLAMA_LIKE, "head_dim": 16}, "GemmaDecoderLayer"),
    Family("gemma2", "Gemma2Config", {**LLAMA_LIKE, "head_dim": 8}, "Gemma2DecoderLayer"),
    Family(
        "gemma3_text",
        "Gemma3TextConfig",
        {**LLAMA_LIKE, "head_dim": 8, "sliding_window": 4},
        "Gemma3DecoderLayer",
    ),
    Family("olmo2", "Olmo2Config", LLAMA_LIKE, "Olmo2DecoderLayer"),
    Family("cohere", "CohereConfig", {**LLAMA_LIKE, "use_qk_norm": True}, "CohereDecoderLayer"),
    Family("cohere2", "Cohere2Config", LLAMA_LIKE, "Cohere2DecoderLayer"),
    Family(
        "granite",
        "GraniteConfig",
        {**LLAMA_LIKE, "attention_bias": True, "residual_multiplier": 0.5, "attention_multiplier": 0.3},
        "GraniteDecoderLayer",
    ),
    Family("smollm3", "SmolLM3Config", LLAMA_LIKE, "SmolLM3DecoderLayer"),
    Family(
        "llama4_text",
        "Llama4TextConfig",
        {**LLAMA_LIKE, "head_dim": 8, "intermediate_size_mlp": 48, "num_local_experts": 2},
        "Llama4TextDecoderLayer",
    ),
    Family("phi", "PhiConfig", {**LLAMA_LIKE, "partial_rotary_factor": 0.5}, "PhiDecoderLayer"),
    Family("phi3", "Phi3Config", LLAMA_LIKE, "Phi3DecoderLayer"),
    Family(
        "gptj",
        "GPTJConfig",
        {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 4, "n_positions": 64},
        "GPTJBlock",
    ),
    # Eight heads over CodeGen's four model-parallel shards: two heads per shard.
    Family(
        "codegen",
        "CodeGenConfig",
        {"vocab_size": 64, "n_embd": 64, "n_layer": 2, "n_head": 8, "rotary_dim": 4, "n_positions": 64},
        "CodeGenBlock",
    ),
    Family(
        "gpt2",
        "GPT2Config",
        {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
        "GPT2Block",
    ),
    Family(
        "gpt_bigcode_mqa",
        "GPTBigCodeConfig",
        {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "multi_query": True},
        "GPTBigCodeBlock",
    ),
    Family(
        "gpt_bigcode_mha",
        "GPTBigCodeConfig",
        {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "multi_query": False},
        "GPTBigCodeBlock",
    ),
    Family(
        "gpt_neox",
        "GPTNeoXConfig",
        {**SMALL, "hidden_size": 32, "num_attention_heads": 4, "attention_bias": True},
        "GPTNeoXLayer",
    ),
    Family(
        "persimmon",
        "PersimmonConfig",
        {**SMALL, "hidden_size": 32, "num_attention_heads": 4, "qk_layernorm": True},
        "PersimmonDecoderLayer",
    ),
    Family(
        "falcon_new",
        "FalconConfig",
        {
            **SMALL,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_kv_heads": 2,
            "new_decoder_architecture": True,
            "bias": True,
        },
        "FalconDecoderLayer",
    ),
    Family(
        "falcon_new_one_norm",
        "FalconConfig",
        {
            **SMALL,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_kv_heads": 2,
            "new_decoder_architecture": True,
            "num_ln_in_parallel_attn": 1,
            "bias": True,
        },
        "FalconDecoderLayer",
    ),
    Family(
        "falcon_mqa",
        "FalconConfig",
        {**SMALL, "hidden_size": 32, "num_attention_heads": 4, "multi_query": True, "bias": True},
        "FalconDecoderLayer",
    ),
    Family(
        "falcon_mha",
        "FalconConfig",
        {
            **SMALL,
            "hidden_size": 32,
            "num_attention_heads": 4,
            "multi_query": False,
            "parallel_attn": False,
            "bias": True,
        },
        "FalconDecoderLayer",
    ),
    Family(
        "bloom",
        "BloomConfig",
        {"vocab_size": 64, "hidden_size": 32, "n_layer": 2, "n_head": 4},
        "BloomBlock",
        module_output_is_write=False,
    ),
    Family(
        "mpt",
        "MptConfig",
        {
            "vocab_size": 64,
            "d_model": 32,
            "n_heads": 4,
            "n_layers": 2,
            "expansion_ratio": 2,
            "max_seq_len": 64,
        },
        "MptBlock",
    ),
    Family(
        "mpt_clip_qkv",
        "MptConfig",
        {
            "vocab_size": 64,
            "d_model": 32,
            "n_heads": 4,
            "n_layers": 2,
            "expansion_ratio": 2,
            "max_seq_len": 64,
            "attn_config": {"clip_qkv": 0.3},
        },
        "MptBlock",
    ),
    Family(
        "opt",
        "OPTConfig",
        {
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 48,
            "word_embed_proj_dim": 32,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
        },
        "OPTDecoderLayer",
    ),
    Family(
        "opt_post_norm",
        "OPTConfig",
        {
            "vocab_size": 64,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 48,
            "word_embed_proj_dim": 32,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
            "do_layer_norm_before": False,
        },
        "OPTDecoderLayer",
    ),
    Family(
        "xglm",
        "XGLMConfig",
        {
            "vocab_size": 64,
            "d_model": 32,
            "num_layers": 2,
            "attention_heads": 4,
            "ffn_dim": 48,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
        },
        "XGLMDecoderLayer",
    ),
    Family(
        "gpt_neo",
        "GPTNeoConfig",
        {
            "vocab_size": 64,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 4,
            "attention_types": [[["global", "local"], 1]],
            "window_size": 4,
            "max_position_embeddings": 64,
        },
        "GPTNeoBlock",
    ),
    Family(
        "stablelm",
        "StableLmConfig",
        {**LLAMA_LIKE, "use_qkv_bias": True, "qk_layernorm": True},
        "StableLmDecoderLayer",
    ),
    Family("starcoder2", "Starcoder2Config", {**LLAMA_LIKE, "use_bias": True}, "Starcoder2DecoderLayer"),
    Family(
        "deepseek_v3",
        "DeepseekV3Config",
        {
            **LLAMA_LIKE,
            "num_key_value_heads": 4,
            "q_lora_rank": 16,
            "kv_lora_rank": 12,
            "qk_rope_head_dim": 4,
            "qk_nope_head_dim": 8,
            "v_head_dim": 6,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
        },
        "DeepseekV3DecoderLayer",
    ),
    Family(
        "diffllama",
        "DiffLlamaConfig",
        LLAMA_LIKE,
        "DiffLlamaDecoderLayer",
        unsupported="differential attention",
    ),
    Family(
        "gpt_oss",
        "GptOssConfig",
        {
            **LLAMA_LIKE,
            "head_dim": 8,
            "attention_bias": True,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 4,
        },
        "GptOssDecoderLayer",
        adjust=_no_sinks,
    ),
    Family(
        "qwen3_next",
        "Qwen3NextConfig",
        {
            **LLAMA_LIKE,
            "head_dim": 8,
            "layer_types": ["linear_attention", "full_attention"],
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16,
        },
        "Qwen3NextDecoderLayer",
        unsupported="gated attention",
    ),
    Family(
        "jamba",
        "JambaConfig",
        {
            **LLAMA_LIKE,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 2,
            "mamba_d_state": 4,
            "mamba_expand": 1,
            "mamba_dt_rank": 4,
            "use_mamba_kernels": False,
        },
        "JambaAttentionDecoderLayer",
    ),
    Family("bert", "BertConfig", BERT_LIKE, "BertLayer", module_output_is_write=False),
    Family("roberta", "RobertaConfig", {**BERT_LIKE, "pad_token_id": 1}, "RobertaLayer", False),
    Family("electra", "ElectraConfig", {**BERT_LIKE, "embedding_size": 16}, "ElectraLayer", False),
    Family("albert", "AlbertConfig", {**BERT_LIKE, "embedding_size": 16}, "AlbertLayer", False),
    Family(
        "distilbert",
        "DistilBertConfig",
        {
            "vocab_size": 64,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 48,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
        },
        "TransformerBlock",
    ),
    Family(
        "modernbert",
        "ModernBertConfig",
        {
            **BERT_LIKE,
            "attention_bias": True,
            "global_attn_every_n_layers": 2,
            "local_attention": 4,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "sep_token_id": 2,
            "cls_token_id": 1,
        },
        "ModernBertEncoderLayer",
    ),
]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def built(request: pytest.FixtureRequest) -> tuple[Family, nn.Module, Any]:
    """The family's tiny random model in eval mode, and its config."""
    family: Family = request.param
    config_class = getattr(transformers, family.config, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {family.config}")
    config = config_class(**family.kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    if family.adjust is not None:
        family.adjust(model)
    return family, model.eval(), config


def attention_blocks(family: Family, model: nn.Module) -> list[nn.Module]:
    """The model's blocks that attend (Qwen3-Next's linear-attention layers share the block class)."""
    blocks = [
        m for m in model.modules() if type(m).__name__ == family.block and not hasattr(m, "linear_attn")
    ]
    assert blocks, f"no {family.block} in {type(model).__name__}"
    return blocks


def hidden_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


@contextmanager
def recording(module: nn.Module, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> Iterator[None]:
    """Append the module's hidden-state input and its (first) output on every call."""

    def pre(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        inputs.append(hidden_input(args, kwargs).detach())

    def post(_module: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> None:
        outputs.append(first(output).detach())

    handles = [
        module.register_forward_pre_hook(pre, with_kwargs=True),
        module.register_forward_hook(post, with_kwargs=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def assert_near(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to 1e-4 of the expected tensor's largest entry."""
    scale = expected.abs().max().item()
    assert scale > 1e-3, "a trivial reference proves nothing"
    err = (actual - expected).abs().max().item()
    assert err <= 1e-4 * scale, f"max error {err:.3g} against scale {scale:.3g}"


def run(model: nn.Module, length: int) -> None:
    ids = torch.arange(3, 3 + length)[None]
    with torch.no_grad():
        model(input_ids=ids)


def test_one_token_ov(built: tuple[Family, nn.Module, Any]) -> None:
    """With one key, each module writes sum_h value_path(x)[g(h)] @ W_O[h] + b_O."""
    family, model, config = built
    heads = config.num_attention_heads
    for block in attention_blocks(family, model):
        attention = attention_module(block)
        if family.unsupported is not None:
            with pytest.raises(Unsupported, match=family.unsupported):
                value_path(attention, config)
            continue
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        writes: list[torch.Tensor] = []
        with recording(attention, inputs, outputs), recording(output_module(attention), [], writes):
            run(model, 1)
        path = value_path(attention, config)
        w_o, b_o = output_projection(attention, heads)
        group = heads // path.kv_heads
        assert w_o.shape[:2] == (heads, path.head_dim)
        assert inputs, "the attention module never ran"
        for x, write, output in zip(inputs, writes, outputs, strict=True):
            values = path(x[0, 0])
            assert values.shape == (path.kv_heads, path.head_dim)
            expected = sum(values[h // group] @ w_o[h] for h in range(heads))
            if b_o is not None:
                expected = expected + b_o
            assert_near(expected, write[0, 0])
            if family.module_output_is_write:
                assert_near(expected, output[0, 0])


def test_output_module_heads(built: tuple[Family, nn.Module, Any]) -> None:
    """On a multi-token forward, the heads' slices of the output module's input through W_O are its output."""
    family, model, config = built
    heads = config.num_attention_heads
    for block in attention_blocks(family, model):
        attention = attention_module(block)
        if family.unsupported == "differential attention":
            with pytest.raises(Unsupported, match=family.unsupported):
                output_module(attention)
            continue
        proj = output_module(attention)
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        with recording(proj, inputs, outputs):
            run(model, 5)
        w_o, b_o = output_projection(attention, heads)
        assert inputs, "the output module never ran"
        for concatenated, output in zip(inputs, outputs, strict=True):
            per_head = concatenated.unflatten(-1, (heads, -1))
            expected = torch.einsum("blhe,hed->bld", per_head, w_o)
            assert_near(expected if b_o is None else expected + b_o, output)


def test_input_norm(built: tuple[Family, nn.Module, Any]) -> None:
    """input_norm(block) of the block's input is the attention module's input."""
    family, model, _config = built
    for block in attention_blocks(family, model):
        attention = attention_module(block)
        block_in: list[torch.Tensor] = []
        attention_in: list[torch.Tensor] = []
        with recording(block, block_in, []), recording(attention, attention_in, []):
            run(model, 5)
        norm = input_norm(block)
        assert block_in, "the block never ran"
        for raw, seen in zip(block_in, attention_in, strict=True):
            with torch.no_grad():
                assert_near(raw if norm is None else norm(raw), seen)


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("olmo2", None),
        ("opt_post_norm", None),
        ("bert", None),
        ("modernbert", None),  # its first layer's attn_norm is an Identity
        ("falcon_new", "ln_attn"),
        ("falcon_new_one_norm", "input_layernorm"),
        ("mpt", "norm_1"),
        ("xglm", "self_attn_layer_norm"),
    ],
)
def test_input_norm_names(family: str, expected: str | None) -> None:
    """The pre-norm is the one each family's block code applies (None where attention reads the raw residual)."""
    spec = next(f for f in FAMILIES if f.name == family)
    config = getattr(transformers, spec.config)(**spec.kwargs)
    model = transformers.AutoModel.from_config(config)
    block = attention_blocks(spec, model)[0]
    norm = input_norm(block)
    assert (norm is None) if expected is None else norm is getattr(block, expected)


@pytest.mark.parametrize(("family", "layer"), [("jamba", "mamba"), ("qwen3_next", "linear_attn")])
def test_no_attention_in_recurrent_layer(family: str, layer: str) -> None:
    """A hybrid's recurrent or linear-attention layer has no attention module, and says so."""
    spec = next(f for f in FAMILIES if f.name == family)
    model = transformers.AutoModel.from_config(getattr(transformers, spec.config)(**spec.kwargs))
    recurrent = next(m for m in model.modules() if hasattr(m, layer) and not hasattr(m, "self_attn"))
    with pytest.raises(RunFailure, match="no attention module"):
        attention_module(recurrent)


def test_bloom_tensor_parallel_refused() -> None:
    """Bloom's slow_but_exact tensor-parallel path never calls dense and drops its bias: refused."""
    spec = next(f for f in FAMILIES if f.name == "bloom")
    config = transformers.BloomConfig(**spec.kwargs, pretraining_tp=2, slow_but_exact=True)
    attention = attention_module(attention_blocks(spec, transformers.AutoModel.from_config(config))[0])
    with pytest.raises(Unsupported, match="slow_but_exact"):
        output_module(attention)
