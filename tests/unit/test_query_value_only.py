"""The query-only and value-only edits (:class:`headscope.capture.edits.QueryOnly`,
:class:`~headscope.capture.edits.ValueOnly`), beside :class:`~headscope.capture.edits.KeyOnly`:

* the whole stream taken out of a layer's query input leaves its queries zero, so its attention is
  uniform over the visible keys, and its keys, values and the layers below are as they were;
* the whole stream taken out of a layer's value input leaves each head's output (the output
  projection's input) equal to its value bias, and the layer's attention as it was;
* all three kinds on one layer, two of a kind among them, equal a hand computation (each projection
  reading the block's norm of the stream less its own removals) to 1e-6;
* a fused projection, a name where the function goes and a string layer are refused before any
  forward, a removal of the wrong shape at the forward that computes it, each naming the edit;
* a model borrowed from the user comes back exactly: no hooks left, the same weights and outputs.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TOY_DIR
from tiny_models import tiny_gpt2, tiny_llama

import headscope as hs
from headscope import capture
from headscope.capture import Attention, Pass
from headscope.capture.edits import KeyOnly, QueryOnly, ValueOnly
from headscope.errors import InputError
from headscope.extend.base import RepeatSpec, model_batches, repeated_tokens


def _batches(loaded, n=2):
    sequences, specials, _ = repeated_tokens(loaded, RepeatSpec(seq_len=10, repeats=2, n_seqs=n, seed=0))
    return model_batches(loaded, sequences, specials, 1)


def _passed(loaded, batches, layer, edits=()):
    """One pass through capture.run, read with plain torch hooks (not headscope's): per window, each
    layer's attention maps, and at ``layer`` the block's input and its projections' outputs."""
    seen: dict[str, dict[int, torch.Tensor]] = {}
    window = {"at": 0}
    block = loaded.model.model.layers[layer]
    attention = block.self_attn

    def keeping(name):
        def hook(_module, args, *rest):
            tensor = rest[-1] if rest else args[0]
            seen.setdefault(name, {})[window["at"]] = tensor.detach().clone()

        return hook

    handles = [
        block.register_forward_pre_hook(
            lambda m, a, kw: keeping("x")(m, (a[0] if a else kw["hidden_states"],)), with_kwargs=True
        ),
        attention.o_proj.register_forward_pre_hook(keeping("heads")),
        *(getattr(attention, f"{p}_proj").register_forward_hook(keeping(p)) for p in "qkv"),
    ]
    maps: dict[int, dict[int, list[torch.Tensor]]] = {}

    def keep(at, weights, batch, q_start):
        window["at"] = int(batch.example_index[0])
        maps.setdefault(at, {}).setdefault(window["at"], []).append(weights.clone())

    def starting(batch):
        window["at"] = int(batch.example_index[0]) + 1  # the next window's number, before its forward

    try:
        capture.run(loaded, batches, Pass(reads=[Attention(keep)], edits=list(edits), on_batch_done=starting))
    finally:
        for handle in handles:
            handle.remove()
    out = {name: dict(values) for name, values in seen.items()}
    out["maps"] = {at: {w: torch.cat(c, 2) for w, c in by.items()} for at, by in maps.items()}
    return out


def _whole_stream(clean):
    return lambda batch: clean["x"][int(batch.example_index[0])]


def test_the_whole_stream_out_of_the_query_input_makes_the_attention_uniform(toy):
    batches = _batches(toy)
    clean = _passed(toy, batches, 1)
    edited = _passed(toy, batches, 1, [QueryOnly(1, _whole_stream(clean))])
    for w in clean["x"]:
        assert torch.equal(edited["q"][w], torch.zeros_like(edited["q"][w]))
        assert torch.equal(edited["k"][w], clean["k"][w]) and torch.equal(edited["v"][w], clean["v"][w])
        assert torch.equal(edited["maps"][0][w], clean["maps"][0][w])  # the layer below
        maps = edited["maps"][1][w][0]  # [H, T, T]
        length = maps.shape[-1]
        uniform = torch.tril(torch.ones(length, length)) / torch.arange(1, length + 1)[:, None]
        assert torch.allclose(maps, uniform.expand_as(maps), atol=1e-6, rtol=0)
        assert (clean["maps"][1][w][0] - uniform).abs().max() > 0.1  # it was not uniform before


def test_the_whole_stream_out_of_the_value_input_leaves_the_value_bias_only():
    loaded = tiny_llama()  # random biases on every projection
    batches = _batches(loaded)
    clean = _passed(loaded, batches, 1)
    edited = _passed(loaded, batches, 1, [ValueOnly(1, _whole_stream(clean))])
    attention = loaded.model.model.layers[1].self_attn
    bias = attention.v_proj.bias.detach()  # [KV * d]
    heads, kv = loaded.layout.n_heads, loaded.layout.n_kv_heads
    d = bias.shape[0] // kv
    expected = torch.cat(
        [bias[(h // (heads // kv)) * d : (h // (heads // kv) + 1) * d] for h in range(heads)]
    )
    for w in clean["x"]:
        assert torch.allclose(edited["v"][w], bias.expand_as(edited["v"][w]), atol=1e-7, rtol=0)
        out = edited["heads"][w]  # [1, T, H * d]
        assert torch.allclose(out, expected.expand_as(out), atol=1e-6, rtol=0)
        assert (clean["heads"][w] - expected).abs().max() > 0.01  # more than the bias before
        assert torch.equal(edited["q"][w], clean["q"][w]) and torch.equal(edited["k"][w], clean["k"][w])
        assert torch.equal(edited["maps"][1][w], clean["maps"][1][w])  # the layer's attention as it was
        assert torch.equal(edited["maps"][0][w], clean["maps"][0][w])


def _reference(loaded, x, layer, query, key, value):
    """Layer ``layer`` of the toy by hand, with its own modules (float32, as the model runs): each
    projection reads the input RMSNorm of ``x`` less its removal; RoPE, GQA, causal softmax.
    Returns (attention [H, T, T], heads [T, H*d])."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    block = loaded.model.model.layers[layer]
    attention = block.self_attn
    config = loaded.model.config
    heads, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim

    def projected(name, removal, count):
        module = getattr(attention, f"{name}_proj")
        return module(block.input_layernorm(x - removal)).view(-1, count, d).transpose(0, 1)  # [count, T, d]

    length = x.shape[0]
    with torch.no_grad():
        q, k, v = projected("q", query, heads), projected("k", key, kv), projected("v", value, kv)
        cos, sin = loaded.model.model.rotary_emb(x[None], torch.arange(length)[None])
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    k, v = k[0].repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    scores = q[0] @ k.transpose(1, 2) / d**0.5
    scores = scores.masked_fill(~torch.tril(torch.ones(length, length, dtype=torch.bool)), float("-inf"))
    weights = scores.softmax(-1)
    return weights, (weights @ v).transpose(0, 1).reshape(length, heads * d)


def test_all_three_kinds_on_one_layer_equal_a_hand_computation(toy):
    batches = _batches(toy)
    clean = _passed(toy, batches, 1)
    generator = torch.Generator().manual_seed(5)
    drawn = {
        name: {w: 0.5 * torch.randn(x.shape, generator=generator) for w, x in clean["x"].items()}
        for name in ("q1", "q2", "k", "v1", "v2")
    }

    def of(name):
        return lambda batch: drawn[name][int(batch.example_index[0])]

    edits = [QueryOnly(1, of("q1")), KeyOnly(1, of("k")), ValueOnly(1, of("v1"))]
    edits += [ValueOnly(1, of("v2")), QueryOnly(1, of("q2"))]
    edited = _passed(toy, batches, 1, edits)
    for w, x in clean["x"].items():
        query, key = drawn["q1"][w] + drawn["q2"][w], drawn["k"][w]
        weights, heads = _reference(toy, x[0], 1, query[0], key[0], (drawn["v1"][w] + drawn["v2"][w])[0])
        # to 1e-6 of the weights (at most 1) and of the outputs' scale: the model subtracts the
        # removals one by one, the hand computation their sum (float32 rounds the two apart)
        assert torch.allclose(edited["maps"][1][w][0], weights, atol=1e-6, rtol=0)
        assert torch.allclose(edited["heads"][w][0], heads, atol=1e-6 * float(heads.abs().max()), rtol=0)
        assert torch.equal(edited["maps"][0][w], clean["maps"][0][w])
        # the hand computation is the model's own where nothing is removed
        zero = torch.zeros_like(x[0])
        weights, heads = _reference(toy, x[0], 1, zero, zero, zero)
        assert torch.allclose(clean["maps"][1][w][0], weights, atol=1e-6, rtol=0)
        assert torch.allclose(clean["heads"][w][0], heads, atol=1e-6, rtol=0)
    # each kind reaches only its own projection: the queries alone move nothing but the queries
    alone = _passed(toy, batches, 1, [QueryOnly(1, of("q1"))])
    w = next(iter(clean["x"]))
    assert (alone["q"][w] - clean["q"][w]).abs().max() > 0.1
    assert torch.equal(alone["k"][w], clean["k"][w]) and torch.equal(alone["v"][w], clean["v"][w])


def _hooks(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]


def test_refusals_name_the_edit(toy, monkeypatch):
    zeros = lambda b: torch.zeros(1)  # noqa: E731
    gpt2 = tiny_gpt2()  # a fused query/key/value projection (c_attn)
    before = [
        (
            toy,
            QueryOnly(1, "L0H1"),
            r"QueryOnly: removed 'L0H1' \(str\) is not a function \(give a function of the batch that "
            r"returns what to take out of layer 1's query input",
        ),
        (toy, ValueOnly("1", zeros), r"ValueOnly: layer '1' \(str\) is not an int"),
        (toy, ValueOnly(2, zeros), r"ValueOnly: layer 2 has no attention \(the attention layers are 0..1\)"),
        (gpt2, QueryOnly(1, zeros), r"QueryOnly: GPT2Attention has no separate query projection \(q_proj\)"),
        (gpt2, ValueOnly(1, zeros), r"cannot be edited on the value side alone"),
    ]
    for loaded, edit, message in before:
        calls = []
        monkeypatch.setattr(type(loaded.base), "__call__", lambda *a, calls=calls, **k: calls.append(1))
        with pytest.raises(InputError, match=message):
            capture.run(loaded, _batches(loaded, 1), Pass(edits=[edit]))
        assert calls == []
        monkeypatch.undo()
    hooks = _hooks(toy.model)
    nothing = lambda b: torch.zeros(1, b.input_ids.shape[1], toy.layout.d_model)  # noqa: E731
    with pytest.raises(
        InputError, match=r"ValueOnly: removed\(batch\) has shape \[1\], not the block input's"
    ):
        capture.run(toy, _batches(toy, 1), Pass(edits=[KeyOnly(1, nothing), ValueOnly(1, zeros)]))
    assert _hooks(toy.model) == hooks


def test_a_borrowed_model_comes_back_exactly():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    model.train()
    model.model.layers[1].register_forward_hook(lambda *_: None)  # the user's own
    implementation = model.config._attn_implementation
    hooks = _hooks(model)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[5, 9, 12, 5, 9, 12, 7]])
    with torch.no_grad():
        logits = model(ids).logits
    loaded = hs.load(model, AutoTokenizer.from_pretrained(TOY_DIR))
    batches = _batches(loaded, 1)
    shape = (1, batches[0].input_ids.shape[1], loaded.layout.d_model)
    removal = lambda b: torch.ones(shape)  # noqa: E731
    edits = [QueryOnly(1, removal), KeyOnly(1, removal), ValueOnly(1, removal), ValueOnly(0, removal)]
    capture.run(loaded, batches, Pass(edits=edits))
    with pytest.raises(InputError, match="ValueOnly: removed"):
        capture.run(loaded, batches, Pass(edits=[QueryOnly(1, removal), ValueOnly(1, lambda b: 1.0)]))
    assert _hooks(model) == hooks
    assert model.training and model.config._attn_implementation == implementation
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)
