"""Q- and K-composition scores read from the weights (headscope.weightroles.composition).

The scores are checked against a dense float64 computation written here from the modules' own weights
(the d_model x d_model W_OV and W_QK materialised, norm gains folded by hand), on tiny random Llama
(GQA), Gemma 3 (MQA, q/k norms, post-attention norm, ``1 + w`` gains) and BERT (query/key in
``.self``); then on planted weights: a zeroed KV group, a source head written into what a destination
head's keys read, and random Gaussian models against the random baseline.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import loaded_tiny, tiny_bert, tiny_gemma, tiny_gpt2, tiny_llama

from headscope.errors import InputError
from headscope.weightroles.composition import composition_scores, random_baseline


def all_heads(loaded):
    layout = loaded.layout
    return [(layer, head) for layer in range(layout.n_layers) for head in range(layout.n_heads)]


def dense_circuits(loaded):
    """Per head (layer, head): (W_OV, W_QK) as dense [D, D] float64, written from the HF modules."""
    model, layout = loaded.model, loaded.layout
    heads, kv = layout.n_heads, layout.n_kv_heads
    group = heads // kv
    bert = hasattr(model, "encoder")
    blocks = model.encoder.layer if bert else model.model.layers
    d_model = layout.d_model
    ones = torch.ones(d_model, dtype=torch.float64)
    circuits = {}
    for layer, block in enumerate(blocks):
        if bert:
            inner = block.attention.self
            q, k, v, o = inner.query, inner.key, inner.value, block.attention.output.dense
            gain_in = post = ones
            q_gain = k_gain = None
        else:
            attn = block.self_attn
            q, k, v, o = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
            gemma = hasattr(block, "post_feedforward_layernorm")
            shift = 1.0 if gemma else 0.0  # Gemma's RMSNorm scales by 1 + w
            gain_in = block.input_layernorm.weight.detach().double() + shift
            post = block.post_attention_layernorm.weight.detach().double() + 1.0 if gemma else ones
            q_gain = attn.q_norm.weight.detach().double() + 1.0 if gemma else None
            k_gain = attn.k_norm.weight.detach().double() + 1.0 if gemma else None
        w_q_all, w_k_all = q.weight.detach().double(), k.weight.detach().double()
        w_v_all, w_o_all = v.weight.detach().double(), o.weight.detach().double()
        d_head = w_q_all.shape[0] // heads
        d_value = w_o_all.shape[1] // heads
        for head in range(heads):
            g = head // group
            w_q = torch.diag(gain_in) @ w_q_all[head * d_head : (head + 1) * d_head].T  # [D, dk]
            w_k = torch.diag(gain_in) @ w_k_all[g * d_head : (g + 1) * d_head].T
            if q_gain is not None:
                w_q, w_k = w_q @ torch.diag(q_gain), w_k @ torch.diag(k_gain)
            w_v = w_v_all[g * d_value : (g + 1) * d_value].T  # [D, dv]
            w_o = w_o_all[:, head * d_value : (head + 1) * d_value].T @ torch.diag(post)  # [dv, D]
            circuits[(layer, head)] = (w_v @ w_o, w_q @ w_k.T)
    return circuits


def dense_scores(loaded):
    circuits = dense_circuits(loaded)
    out = {}
    for dest, (_, qk) in circuits.items():
        row = {}
        for src, (ov, _) in circuits.items():
            if src[0] >= dest[0]:
                continue
            scale = torch.linalg.norm(ov) * torch.linalg.norm(qk)
            row[src] = (
                float(torch.linalg.norm(ov @ qk) / scale),
                float(torch.linalg.norm(ov @ qk.T) / scale),
            )
        out[dest] = row
    return out


@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma, tiny_bert], ids=["llama", "gemma", "bert"])
def test_scores_match_dense_computation(build):
    loaded = build()
    got = composition_scores(loaded, all_heads(loaded))
    want = dense_scores(loaded)
    assert got.keys() == want.keys()
    for dest, row in want.items():
        assert got[dest].keys() == row.keys()
        for src, (q, k) in row.items():
            assert got[dest][src] == pytest.approx((q, k), abs=1e-6), (dest, src)
    # Q and K differ (they read different sides), and every earlier head is a source.
    layout = loaded.layout
    last = (layout.n_layers - 1, 0)
    assert len(got[last]) == (layout.n_layers - 1) * layout.n_heads
    assert any(abs(q - k) > 1e-3 for q, k in got[last].values())
    assert got[(0, 0)] == {}


@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma, tiny_bert], ids=["llama", "gemma", "bert"])
def test_scores_lie_in_unit_interval(build):
    loaded = build()
    scores = composition_scores(loaded, all_heads(loaded))
    values = [v for row in scores.values() for pair in row.values() for v in pair]
    assert values and all(0.0 <= v <= 1.0 for v in values)


def test_gqa_heads_read_their_kv_group():
    loaded = tiny_llama()  # 4 query heads over 2 KV groups
    assert loaded.layout.n_kv_heads == 2 and loaded.layout.n_heads == 4
    dest = all_heads(loaded)
    before = composition_scores(loaded, dest)
    attn2 = loaded.model.model.layers[2].self_attn
    attn0 = loaded.model.model.layers[0].self_attn
    d_head = loaded.layout.head_dim
    with torch.no_grad():
        attn2.k_proj.weight[:d_head] = 0.0  # layer 2's KV group 0 (query heads 0, 1) reads nothing
        attn0.v_proj.weight[d_head:] = 0.0  # layer 0's KV group 1 (query heads 2, 3) writes nothing
    after = composition_scores(loaded, dest)
    for head in (0, 1):
        assert all(pair == (0.0, 0.0) for pair in after[(2, head)].values())
    for head in (2, 3):
        for src, (q, k) in after[(2, head)].items():
            if src[0] == 0 and src[1] in (2, 3):
                continue
            assert (q, k) == pytest.approx(before[(2, head)][src], abs=1e-12)
    for dest_pair, row in after.items():
        for src, pair in row.items():
            if src[0] == 0 and src[1] in (2, 3):
                assert pair == (0.0, 0.0)
            elif src[0] == 0 and dest_pair[0] == 1:  # layer 1 untouched, sources 0 and 1 unchanged
                assert pair == pytest.approx(before[dest_pair][src], abs=1e-12)


def test_planted_source_writes_where_the_keys_read():
    loaded = tiny_llama()  # random input-norm gains: the plant must use the folded W_K
    layers = loaded.model.model.layers
    d_head, heads = loaded.layout.head_dim, loaded.layout.n_heads
    dest, src = (2, 1), (0, 3)
    generator = torch.Generator().manual_seed(1)
    block = layers[dest[0]]
    gain = block.input_layernorm.weight.detach().double()
    with torch.no_grad():
        # A rank-1 W_Q makes W_QK^T = W_K' a (gain * b)^T rank 1: its left direction p = W_K' a.
        a = torch.randn(d_head, generator=generator, dtype=torch.float64)
        b = torch.randn(loaded.layout.d_model, generator=generator, dtype=torch.float64)
        rows = slice(dest[1] * d_head, (dest[1] + 1) * d_head)
        block.self_attn.q_proj.weight[rows] = torch.outer(a, b).float()
        group = dest[1] // (heads // loaded.layout.n_kv_heads)
        w_k = (
            torch.diag(gain) @ block.self_attn.k_proj.weight[group * d_head : (group + 1) * d_head].double().T
        )
        p = w_k @ a
        # The source writes only along p: W_O[h] = w u^T.
        w = torch.randn(d_head, generator=generator, dtype=torch.float64)
        cols = slice(src[1] * d_head, (src[1] + 1) * d_head)
        layers[src[0]].self_attn.o_proj.weight[:, cols] = torch.outer(p / p.norm(), w).float()
    scores = composition_scores(loaded, all_heads(loaded))
    planted = scores[dest][src][1]
    assert planted == pytest.approx(1.0, abs=1e-6)
    others = [k for d, row in scores.items() for s, (_, k) in row.items() if (d, s) != (dest, src)]
    assert max(others) < planted - 0.05
    baseline = random_baseline(loaded)[1]
    assert planted > 3 * baseline
    # The Q side of the same pair reads another direction (b): not planted.
    assert scores[dest][src][0] < 0.9


def test_random_baseline_is_the_mean_score_of_random_models():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=8,
    )
    torch.manual_seed(0)
    loaded = loaded_tiny(LlamaForCausalLM(config).eval(), config)  # Gaussian weights, unit gains
    scores = composition_scores(loaded, all_heads(loaded))
    pairs = [pair for row in scores.values() for pair in row.values()]
    mean_q = sum(q for q, _ in pairs) / len(pairs)
    mean_k = sum(k for _, k in pairs) / len(pairs)
    base_q, base_k = random_baseline(loaded)
    assert base_q == pytest.approx(mean_q, rel=0.05)
    assert base_k == pytest.approx(mean_k, rel=0.05)
    assert random_baseline(loaded) == (base_q, base_k)  # seeded
    assert 0.0 < base_q < 1.0 and 0.0 < base_k < 1.0


def test_layernorm_centring_folds_on_both_sides():
    """A pre-LayerNorm model (OPT): its gain and centring P = I - 11^T/D fold into W_Q and W_K on the
    input side, and P into the source's W_O (TransformerLens' fold_ln and center_writing_weights)."""
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        vocab_size=50,
        hidden_size=32,
        ffn_dim=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    )
    torch.manual_seed(0)
    model = OPTForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)
    loaded = loaded_tiny(model, config)
    d_model, heads, d_head = 32, 4, 8
    centre = torch.eye(d_model, dtype=torch.float64) - 1.0 / d_model
    blocks = model.model.decoder.layers
    circuits = {}
    for layer, block in enumerate(blocks):
        attn = block.self_attn
        fold = centre @ torch.diag(block.self_attn_layer_norm.weight.detach().double())
        for head in range(heads):
            rows = slice(head * d_head, (head + 1) * d_head)
            w_q = fold @ attn.q_proj.weight.detach().double()[rows].T
            w_k = fold @ attn.k_proj.weight.detach().double()[rows].T
            ov = (
                attn.v_proj.weight.detach().double()[rows].T
                @ attn.out_proj.weight.detach().double()[:, rows].T
            )
            circuits[(layer, head)] = (ov @ centre, w_q @ w_k.T)
    got = composition_scores(loaded, [(2, h) for h in range(heads)])
    for dest, row in got.items():
        qk = circuits[dest][1]
        assert len(row) == 2 * heads
        for src, pair in row.items():
            ov = circuits[src][0]
            scale = torch.linalg.norm(ov) * torch.linalg.norm(qk)
            want = (float(torch.linalg.norm(ov @ qk) / scale), float(torch.linalg.norm(ov @ qk.T) / scale))
            assert pair == pytest.approx(want, abs=1e-6), (dest, src)


def test_fused_gpt2_projections_match_dense_computation():
    """GPT-2's c_attn (Conv1D, q | k | v) read through qk's layout, LayerNorm centring folded on both sides."""
    loaded = tiny_gpt2()
    blocks, heads, d_model = loaded.model.transformer.h, loaded.layout.n_heads, loaded.layout.d_model
    d = d_model // heads
    centre = torch.eye(d_model, dtype=torch.float64) - 1.0 / d_model
    circuits = {}
    for layer, block in enumerate(blocks):
        fused = block.attn.c_attn.weight.detach().double()  # [D, 3D], x @ W
        out = block.attn.c_proj.weight.detach().double()  # [D, D], x @ W
        gain = torch.diag(block.ln_1.weight.detach().double())
        for head in range(heads):
            cols = slice(head * d, (head + 1) * d)
            w_q = centre @ gain @ fused[:, :d_model][:, cols]
            w_k = centre @ gain @ fused[:, d_model : 2 * d_model][:, cols]
            w_v = fused[:, 2 * d_model :][:, cols]
            circuits[(layer, head)] = (w_v @ out[cols] @ centre, w_q @ w_k.T)
    got = composition_scores(loaded, all_heads(loaded))
    for dest, (_, qk) in circuits.items():
        for src, (ov, _) in circuits.items():
            if src[0] >= dest[0]:
                continue
            scale = torch.linalg.norm(ov) * torch.linalg.norm(qk)
            want = (float(torch.linalg.norm(ov @ qk) / scale), float(torch.linalg.norm(ov @ qk.T) / scale))
            assert got[dest][src] == pytest.approx(want, abs=1e-6), (dest, src)


def test_bad_destination_is_refused():
    loaded = tiny_bert()
    with pytest.raises(InputError):
        composition_scores(loaded, [(5, 0)])
    with pytest.raises(InputError):
        composition_scores(loaded, [(1, 4)])
