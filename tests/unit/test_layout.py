"""HeadLayout.from_config across transformers families, from each family's own config class.

The expectations come from the modeling code in transformers 5.24 (how many KV heads the
attention module builds, which mask each layer gets), not from the config's attribute names;
a few tests build the tiny model and check its projections against the layout.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from headscope.models.layout import HeadLayout, layer_attention


def layout(config: tf.PretrainedConfig) -> HeadLayout:
    return HeadLayout.from_config(config)


def heads(lay: HeadLayout) -> tuple[int, int, int, int, int, int]:
    return (lay.n_layers, lay.n_heads, lay.n_kv_heads, lay.head_dim, lay.v_head_dim, lay.d_model)


# ----------------------------------------------------------------------------- KV heads and head dims


def test_falcon_new_architecture_keeps_num_kv_heads():
    config = tf.FalconConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        num_kv_heads=2,
        new_decoder_architecture=True,
    )
    lay = layout(config)
    assert heads(lay) == (2, 4, 2, 8, 8, 32) and lay.group_size == 2
    # FalconAttention packs, per KV head, its query heads then one key and one value head.
    model = tf.FalconModel(config)
    assert model.h[0].self_attention.query_key_value.out_features == (4 + 2 * 2) * 8


@pytest.mark.parametrize(("multi_query", "kv"), [(True, 1), (False, 4)])
def test_falcon_old_architecture_is_multi_query_or_one_kv_head_per_query_head(multi_query, kv):
    # num_kv_heads is ignored without new_decoder_architecture (FalconAttention._split_heads).
    config = tf.FalconConfig(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=2, num_kv_heads=2, multi_query=multi_query
    )
    assert layout(config).n_kv_heads == kv
    fused = tf.FalconModel(config).h[0].self_attention.query_key_value.out_features
    assert fused == (4 + 2 * kv) * 8


def test_gpt_bigcode_multi_query_has_one_kv_head():
    config = tf.GPTBigCodeConfig(n_embd=32, n_head=4, n_layer=2, n_positions=64, multi_query=True)
    assert heads(layout(config)) == (2, 4, 1, 8, 8, 32) and layout(config).max_positions == 64
    assert tf.GPTBigCodeModel(config).h[0].attn.c_attn.out_features == 32 + 2 * 8
    assert layout(tf.GPTBigCodeConfig(n_embd=32, n_head=4, n_layer=2, multi_query=False)).n_kv_heads == 4


def test_deepseek_v3_mla_queries_and_keys_are_nope_plus_rope_and_values_v_head_dim():
    config = tf.DeepseekV3Config(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=64,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=2,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_nope_head_dim=12,
        qk_rope_head_dim=4,
        v_head_dim=6,
    )
    lay = layout(config)
    assert config.head_dim == 4  # the config's head_dim is the rotary part only
    assert heads(lay) == (2, 4, 4, 16, 6, 32) and lay.value_dim == 6
    attention = tf.DeepseekV3Model(config).layers[0].self_attn
    assert attention.q_proj.out_features == lay.n_heads * lay.head_dim
    # One decompressed key (nope part) and value per query head.
    assert attention.kv_b_proj.out_features == lay.n_kv_heads * (12 + lay.v_head_dim)
    assert attention.o_proj.in_features == lay.n_heads * lay.v_head_dim


def test_mimo_values_are_narrower_than_queries_and_keys():
    config = tf.MiMoV2FlashConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        v_head_dim=8,
        num_hidden_layers=2,
    )
    lay = layout(config)
    assert (lay.head_dim, lay.v_head_dim, lay.n_kv_heads) == (12, 8, 2)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (tf.BertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2), (2, 4, 4, 8, 8, 32)),
        (tf.RobertaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2), (2, 4, 4, 8, 8, 32)),
        (tf.DistilBertConfig(dim=32, n_heads=4, n_layers=3, hidden_dim=64), (3, 4, 4, 8, 8, 32)),
        (
            tf.AlbertConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, embedding_size=16),
            (2, 4, 4, 8, 8, 32),
        ),
        (
            tf.ElectraConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, embedding_size=16),
            (2, 4, 4, 8, 8, 32),
        ),
        (tf.DebertaV2Config(hidden_size=32, num_attention_heads=4, num_hidden_layers=2), (2, 4, 4, 8, 8, 32)),
        (tf.GPT2Config(n_embd=32, n_head=4, n_layer=2), (2, 4, 4, 8, 8, 32)),
        (tf.GPTJConfig(n_embd=32, n_head=4, n_layer=2, rotary_dim=4), (2, 4, 4, 8, 8, 32)),
        (tf.CodeGenConfig(n_embd=32, n_head=4, n_layer=2, rotary_dim=4), (2, 4, 4, 8, 8, 32)),
        (tf.BloomConfig(hidden_size=32, n_head=4, n_layer=2), (2, 4, 4, 8, 8, 32)),
        (
            tf.OPTConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=64),
            (2, 4, 4, 8, 8, 32),
        ),
        (tf.XGLMConfig(d_model=32, attention_heads=4, num_layers=2, ffn_dim=64), (2, 4, 4, 8, 8, 32)),
        # transformers' MptAttention has one fused Wqkv of 3 x d_model: no grouped KV heads.
        (tf.MptConfig(d_model=32, n_heads=4, n_layers=2, max_seq_len=128), (2, 4, 4, 8, 8, 32)),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, tuple) else "",
)
def test_encoders_and_older_decoders_read_their_attribute_maps(config, expected):
    assert heads(layout(config)) == expected


def test_context_from_the_config_where_it_has_one():
    assert layout(tf.MptConfig(d_model=32, n_heads=4, n_layers=2, max_seq_len=128)).max_positions == 128
    assert layout(tf.GPTJConfig(n_embd=32, n_head=4, n_layer=2, n_positions=96)).max_positions == 96
    assert layout(tf.BloomConfig(hidden_size=32, n_head=4, n_layer=2)).max_positions is None  # ALiBi


# ----------------------------------------------------------------------------- local, chunked, global


def test_gpt_neo_local_layers_come_from_attention_types_and_window_size():
    config = tf.GPTNeoConfig(
        hidden_size=32, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]], window_size=8
    )
    lay = layout(config)
    assert (lay.local_layers, lay.window, lay.global_layers) == ((1,), 8, (0,))
    assert layer_attention(config, 2)["summary"] == "local (window 8): 1; global: 0"
    assert tf.GPTNeoModel(config).h[1].attn.attention.attention_type == "local"


def test_llama4_nope_layers_are_chunked():
    config = tf.Llama4TextConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=4,
        attention_chunk_size=4,
    )
    lay = layout(config)
    assert (lay.chunked_layers, lay.chunk, lay.global_layers, lay.local_layers) == ((0, 1, 2), 4, (3,), ())
    assert layer_attention(config, 4)["summary"] == "chunked (chunk 4): 0–2; global: 3"
    # The multimodal config reads its text config.
    assert layout(tf.Llama4Config(text_config=config.to_dict())).chunked_layers == (0, 1, 2)


def test_mistral_windows_every_layer_and_ignores_layer_types():
    config = tf.MistralConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=16
    )
    assert (layout(config).local_layers, layout(config).window) == ((0, 1, 2), 16)
    off = tf.MistralConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, sliding_window=None
    )
    assert layout(off).local_layers == () and layout(off).window is None
    # MistralModel masks with sliding_window alone; layer_types only draws a warning.
    stray = tf.MistralConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        sliding_window=16,
        layer_types=["full_attention"] * 2,
    )
    assert layout(stray).local_layers == (0, 1)


@pytest.mark.parametrize("family", [tf.Qwen2Config, tf.Qwen3Config])
def test_qwen_windows_only_layers_from_max_window_layers_and_only_with_use_sliding_window(family):
    kwargs = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4}
    kwargs["sliding_window"] = 8
    assert layout(family(**kwargs, max_window_layers=2)).local_layers == ()  # use_sliding_window=False
    on = layout(family(**kwargs, max_window_layers=2, use_sliding_window=True))
    assert (on.local_layers, on.window, on.global_layers) == ((2, 3), 8, (0, 1))


@pytest.mark.parametrize("family", [tf.Starcoder2Config, tf.Phi3Config, tf.MixtralConfig])
def test_uniform_sliding_window_families(family):
    kwargs = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    assert layout(family(**kwargs, sliding_window=8)).local_layers == (0, 1)
    assert layout(family(**kwargs)).local_layers == ()


def test_qwen3_moe_window_depends_on_use_sliding_window():
    kwargs = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "sliding_window": 8}
    assert layout(tf.Qwen3MoeConfig(**kwargs)).local_layers == ()
    assert layout(tf.Qwen3MoeConfig(**kwargs, use_sliding_window=True)).local_layers == (0, 1)


def test_gpt_oss_and_modernbert_follow_layer_types():
    oss = layout(
        tf.GptOssConfig(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=4,
            head_dim=8,
            sliding_window=8,
        )
    )
    assert (oss.local_layers, oss.global_layers, oss.window) == ((0, 2), (1, 3), 8)
    bert = tf.ModernBertConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=4,
        global_attn_every_n_layers=2,
        local_attention=16,
    )
    assert (layout(bert).local_layers, layout(bert).global_layers, layout(bert).window) == ((1, 3), (0, 2), 8)


# ----------------------------------------------------------------------------- hybrids


def test_qwen3_next_linear_attention_layers_are_not_attention():
    config = tf.Qwen3NextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=4
    )
    lay = layout(config)
    assert lay.attention_layers == (3,) and lay.global_layers == (3,)
    assert lay.non_attention_layers == (
        (0, "linear_attention"),
        (1, "linear_attention"),
        (2, "linear_attention"),
    )
    assert layer_attention(config, 4)["summary"] == "global: 3; not attention (linear_attention): 0–2"


def test_jamba_attention_layers_from_period_and_offset():
    config = tf.JambaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=4,
        attn_layer_period=2,
        attn_layer_offset=1,
        num_experts=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        intermediate_size=32,
        mamba_d_state=4,
    )
    lay = layout(config)
    assert lay.attention_layers == (1, 3) and lay.non_attention_layers == ((0, "mamba"), (2, "mamba"))
    model = tf.JambaModel(config)
    assert [i for i, layer in enumerate(model.layers) if hasattr(layer, "self_attn")] == [1, 3]
    assert model.layers[1].self_attn.k_proj.out_features == lay.n_kv_heads * lay.head_dim


def test_bamba_and_granitemoehybrid_attention_layer_indices():
    bamba = tf.BambaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
    )
    assert layout(bamba).attention_layers == (1,)
    assert layout(bamba).non_attention_layers == ((0, "linear_attention"), (2, "linear_attention"))
    granite = tf.GraniteMoeHybridConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=3,
        mamba_n_heads=4,
        mamba_d_head=16,
        num_key_value_heads=2,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
    )
    assert layout(granite).attention_layers == (1,)


def test_zamba2_hybrid_layers_run_attention():
    config = tf.Zamba2Config(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=3,
        layers_block_type=["linear_attention", "hybrid", "linear_attention"],
    )
    assert layout(config).attention_layers == (1,)


def test_layer_attention_summary_names_every_kind():
    config = tf.RecurrentGemmaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=3,
        attention_window_size=8,
        block_types=["recurrent", "recurrent", "attention"],
    )
    kinds = layer_attention(config, 3)
    assert kinds["local_layers"] == [2] and kinds["global_layers"] == []
    assert kinds["summary"] == "local (window 8): 2; global: none; not attention (linear_attention): 0–1"


# ----------------------------------------------------------------------------- describe


def test_describe_names_groups_and_value_dim():
    plain = HeadLayout(2, 8, 2, 16, 128, None)
    assert plain.describe() == "2 layers x 8 query heads (2 KV heads, 4 per group), head dim 16, d_model 128"
    mla = HeadLayout(4, 4, 4, 16, 32, None, value_dim=6, non_attention_layers=((0, "mamba"),))
    assert mla.describe() == (
        "4 layers x 4 query heads (4 KV heads, 1 per group), query/key head dim 16, value head dim 6, "
        "d_model 32, attention in 3 of 4 layers"
    )
    assert mla.attention_layers == (1, 2, 3) and mla.global_layers == (1, 2, 3)


def test_existing_fields_keep_their_defaults():
    lay = HeadLayout(3, 4, 4, 8, 32, None)
    assert lay.attention_layers == (0, 1, 2) and lay.v_head_dim == 8 and lay.value_dim is None
    assert lay.chunked_layers == () and lay.chunk is None and lay.non_attention_layers == ()


def test_kv_projection_matches_layout_for_a_gqa_family():
    config = tf.Qwen3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_hidden_layers=1
    )
    lay = layout(config)
    attention = tf.Qwen3Model(config).layers[0].self_attn
    assert attention.k_proj.out_features == lay.n_kv_heads * lay.head_dim == 24
    assert attention.v_proj.out_features == lay.n_kv_heads * lay.v_head_dim
    assert torch.Size([lay.n_heads * lay.head_dim]) == attention.q_proj.weight.shape[:1]
