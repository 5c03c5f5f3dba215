"""The value side of a head (issue 56): its output split over the sources of its values, checked
against an independent computation with plain transformers hooks (every source projected), and a
planted V-composition recovered."""

from __future__ import annotations

import pytest
import tiny_models
import torch
from conftest import TOY_DIR
from tiny_models import tiny_llama

from headscope.analyses.qk import explain
from headscope.extend.base import RepeatSpec, repeated_tokens
from headscope.models import load


def _pairs(loaded, n: int, seed: int):
    sequences, specials, _ = repeated_tokens(loaded, RepeatSpec(seq_len=12, repeats=2, n_seqs=n, seed=seed))
    return list(zip(sequences, specials, strict=True))


def _hooked_value_parts(
    model, ids: list[int], layer: int
) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    """Plain hooks on an eager Llama: each source's write below ``layer`` (embed, LjHm through its
    W_O slice, mlpj as the remainder), through layer ``layer``'s input RMSNorm with its statistic
    frozen and W_V, then each head's attention and W_O slice: ``{head: {source: sum_q <o_b, o>}}``
    and ``{head: sum_q |o|^2}``."""
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = config.head_dim
    blocks = model.model.layers
    inputs, head_outs = {}, {}
    hooks = [
        blocks[j].register_forward_pre_hook(
            lambda m, a, kw, j=j: inputs.__setitem__(j, (a[0] if a else kw["hidden_states"])[0].double()),
            with_kwargs=True,
        )
        for j in range(layer + 1)
    ]
    hooks += [
        blocks[j].self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, j=j: head_outs.__setitem__(j, a[0][0].double())
        )
        for j in range(layer)
    ]
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    writes = {"embed": inputs[0]}
    for j in range(layer):
        w_o = blocks[j].self_attn.o_proj.weight.detach().double()  # [D, H*d]
        total = torch.zeros_like(inputs[0])
        for h in range(heads):
            write = head_outs[j][:, h * d : (h + 1) * d] @ w_o[:, h * d : (h + 1) * d].T
            writes[f"L{j}H{h}"] = write
            total = total + write
        writes[f"mlp{j}"] = inputs[j + 1] - inputs[j] - total
    x = inputs[layer]
    norm = blocks[layer].input_layernorm
    rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    gain = norm.weight.detach().double()
    w_v = blocks[layer].self_attn.v_proj.weight.detach().double()  # [KV*d, D]
    w_o = blocks[layer].self_attn.o_proj.weight.detach().double()
    attention = out.attentions[layer][0].double()  # [H, T, T]
    parts, totals = {}, {}
    for h in range(heads):
        g = h // (heads // kv)
        rows_v = w_v[g * d : (g + 1) * d]
        rows_o = w_o[:, h * d : (h + 1) * d]

        def through(write, a=attention[h], rows_v=rows_v, rows_o=rows_o):
            return a @ ((gain * write / rms) @ rows_v.T) @ rows_o.T  # [T, D]

        o = through(x)
        totals[h] = float(o.pow(2).sum())
        parts[h] = {name: float((through(w) * o).sum()) for name, w in writes.items()}
    return parts, totals


def test_the_value_side_equals_plain_hooks_on_the_toy():
    loaded = load(str(TOY_DIR))
    pairs = _pairs(loaded, 4, 0)
    found, _ = explain(
        loaded, pairs[:2], pairs[2:], "toy", [(1, h) for h in range(4)], rows=None, n_resamples=0, value=True
    )
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(TOY_DIR, attn_implementation="eager").eval()
    sums: dict[int, dict[str, float]] = {h: {} for h in range(4)}
    totals = dict.fromkeys(range(4), 0.0)
    for ids, _ in pairs[2:]:
        parts, total = _hooked_value_parts(eager, list(ids), 1)
        for h in range(4):
            totals[h] += total[h]
            for name, value in parts[h].items():
                sums[h][name] = sums[h].get(name, 0.0) + value
    for h in range(4):
        entry = found.head(1, h)
        shares = {item["source"]: item["share"] for item in entry["value"]}
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
        assert shares["bias"] == pytest.approx(0.0, abs=1e-9)  # the toy has no biases
        for name, value in sums[h].items():
            assert shares[name] == pytest.approx(value / totals[h], abs=1e-6), (h, name)


def test_the_value_parts_sum_to_the_output_on_a_gqa_model_with_biases():
    """A tiny Llama with random biases on every projection (GQA 4 over 2): the value bias and the
    input norm's output go to ``bias``; each head's value shares sum to 1."""
    loaded = tiny_llama()
    pairs = _pairs(loaded, 4, 1)
    found, _ = explain(
        loaded, pairs[:2], pairs[2:], "tiny", [(2, h) for h in range(4)], rows=None, n_resamples=0, value=True
    )
    for h in range(4):
        entry = found.head(2, h)
        shares = {item["source"]: item["share"] for item in entry["value"]}
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
        assert abs(shares["bias"]) > 1e-4  # v_proj's bias is a source of every value
        assert entry["output"] > 0 and entry["value_unresolved"] is None
    assert found.check["score_error"] < 1e-6


def test_the_planted_k_composition_is_an_edge(tmp_path):
    """The toy with layer 0's heads but L0H1 silenced: every induction head's keys come from L0H1
    (share >= 0.8, measured 0.92 by qk), an edge with its interval above 0 and a verified ratio; the
    edges CSV has the declared columns."""
    import headscope as hs
    from headscope.analyses.graph import EDGE_COLUMNS

    planted = load(str(TOY_DIR))
    with torch.no_grad():
        weight = planted.model.model.layers[0].self_attn.o_proj.weight
        for head in (0, 2, 3):
            weight[:, head * 16 : (head + 1) * 16] = 0
    result = hs.graph(
        planted,
        heads="L1H0,L1H1,L1H2,L1H3",
        repeat_seq=2,
        seq_len=20,
        windows=5,
        rows=0,
        resamples=200,
        verify=2,
    )
    found = result.graph
    for head in range(4):
        keys = [e for e in found.edges if (e["layer"], e["head"], e["side"]) == (1, head, "key")]
        assert keys[0]["source"] == "L0H1" and keys[0]["share"] >= 0.8 and keys[0]["ci_low"] > 0.5
        assert keys[0]["measure"] == "margin"
        values = [e for e in found.edges if (e["layer"], e["head"], e["side"]) == (1, head, "value")]
        assert values and values[0]["measure"] == "output"
    verified = [e for e in found.edges if e["verified_ratio"] is not None]
    assert len(verified) == 6 and all(e["verified_ratio"] > 1.5 for e in verified)  # 3 sides x 2 heads
    path = tmp_path / "edges.csv"
    result.graph.edges_table(result.model).to_csv(path, index=False)
    import pandas as pd

    table = pd.read_csv(path)
    assert list(table.columns) == EDGE_COLUMNS and len(table) == len(found.edges)
    back = hs.Result.from_json(result.to_json())
    assert back.graph.edges == found.edges


def _tiny(name: str):
    import test_qk

    return {
        "gemma": tiny_models.tiny_gemma,
        "gpt2": tiny_models.tiny_gpt2,
        "llama": tiny_models.tiny_llama,
        "bigcode-mqa": lambda: test_qk.tiny_bigcode(True),
        "codegen": test_qk.tiny_codegen,
    }[name]()


@pytest.mark.parametrize("family", ["gemma", "gpt2", "llama", "bigcode-mqa", "codegen"])
def test_the_value_side_reads_the_models_own_values(family):
    """What the value side splits, A @ (x W_V + b_V) per head, is the model's own head output (the
    output projection's input, hooked, eager attention) on fused, MQA, GQA and sliding-window
    families: the value parts sum to each head's output by construction, so this is what ties them
    to the model."""
    from headscope.capture.sources import Decomposer
    from headscope.models import anatomy, projections

    loaded = _tiny(family)
    model = loaded.model
    model.set_attn_implementation("eager")
    attention = projections.attention_module(anatomy.blocks(model)[1])
    seen = {}
    hooks = [
        attention.register_forward_pre_hook(
            lambda m, a, kw: seen.__setitem__("x", (a[0] if a else kw["hidden_states"])[0].double()),
            with_kwargs=True,
        ),
        projections.output_module(attention).register_forward_pre_hook(
            lambda m, a: seen.__setitem__("z", a[0][0].double())
        ),
    ]
    torch.manual_seed(0)
    ids = torch.randint(3, 40, (1, 12))
    try:
        with torch.no_grad():
            out = model(ids, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    w_v, b_v, _ = Decomposer(loaded, 1)._value_weights()
    values = torch.einsum("td,gde->gte", seen["x"], w_v) + (0 if b_v is None else b_v[:, None])
    heads = loaded.layout.n_heads
    groups = torch.arange(heads) // (heads // w_v.shape[0])
    ours = torch.einsum("htk,hke->hte", out.attentions[1][0].double(), values[groups])
    theirs = seen["z"].reshape(12, heads, -1).transpose(0, 1)
    assert float((ours - theirs).abs().max() / theirs.abs().max()) < 1e-6  # measured <= 1.9e-7
