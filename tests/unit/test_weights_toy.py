"""Weight-only roles on toy models whose OV circuits are set by hand (no training).

The toy has an identity embedding and unembedding (vocabulary = model width = 64), unit norm
gains, and heads whose ``W_V`` and ``W_O`` are chosen so that the OV circuit is the identity
(copying), minus the identity (suppression), a successor permutation on one task, or random.
"""

from __future__ import annotations

import pytest
import torch
from conftest import word_tokenizer

import headscope as hs
from headscope.analyses.weights import weights
from headscope.data.ordinal import load_ordinal
from headscope.models import LoadedModel
from headscope.weightroles.ov import Candidates, Circuits, rank_tests

V = 64
TASK = list(range(10, 20))  # token ids of the ordinal task w10 .. w19


def _tokenizer():
    return word_tokenizer(V)


def toy(n_kv: int = 2, n_heads: int = 4) -> LoadedModel:
    """Layer 0: heads 0, 1 read KV group 0, heads 2, 3 group 1 (with n_kv = 2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=V,
        hidden_size=V,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=V,
        tie_word_embeddings=False,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(torch.eye(V))
        model.get_output_embeddings().weight.copy_(torch.eye(V))
    loaded = hs.load(model, _tokenizer(), name="toy")
    return loaded


def _set_head(loaded: LoadedModel, layer: int, w_v: dict[int, torch.Tensor], w_o: dict[int, torch.Tensor]):
    """Row-vector convention: a head maps x to x @ W_V[group] @ W_O[head]."""
    attention = loaded.model.model.layers[layer].self_attn
    d = V
    with torch.no_grad():
        for group, matrix in w_v.items():
            attention.v_proj.weight[group * d : (group + 1) * d] = matrix.T
        for head, matrix in w_o.items():
            attention.o_proj.weight[:, head * d : (head + 1) * d] = matrix.T


def _successor() -> torch.Tensor:
    """Member i -> member i + 1 on the task; every other token (and the last member) -> 0."""
    perm = torch.zeros(V, V)
    for a, b in zip(TASK, TASK[1:], strict=False):
        perm[a, b] = 1.0
    return perm


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tasks") / "toy.yaml"
    members = ", ".join(f"w{i}" for i in TASK)
    path.write_text(f"name: toy\ndescription: toy\ntasks:\n  - name: toy\n    members: [{members}]\n")
    return load_ordinal(path)


@pytest.fixture(scope="module")
def hand_set(task_file):
    loaded = toy()
    eye = torch.eye(V)
    generator = torch.Generator().manual_seed(1)
    random_v = torch.randn(V, V, generator=generator)
    random_o = torch.randn(V, V, generator=generator)
    # Layer 0, GQA: group 0 = I, group 1 = -I; every W_O = I.
    _set_head(loaded, 0, {0: eye, 1: -eye}, {h: eye for h in range(4)})
    # Layer 1: head 0 successor, heads 1-3 random (group 0 successor, group 1 random).
    _set_head(loaded, 1, {0: eye, 1: random_v}, {0: _successor(), 1: random_o, 2: random_o, 3: eye})
    report = weights(loaded, tokens=V, k=5, embedding="raw", task_sets=[task_file], n_resamples=1000)
    return loaded, report


def _score(report, relation: str, layer: int, head: int, data: str = "vocab"):
    table = report.table
    row = table[
        (table.relation == relation) & (table.layer == layer) & (table["head"] == head) & (table.data == data)
    ]
    assert len(row) == 1
    return row.iloc[0]


def test_identity_ov_copies_and_minus_identity_suppresses(hand_set):
    _, report = hand_set
    for head in (0, 1):  # KV group 0: W_V = I
        assert _score(report, "copying", 0, head).score == 1.0
        assert _score(report, "suppression", 0, head).score == 0.0
        assert _score(report, "eigenvalue", 0, head).score == pytest.approx(1.0)
        assert _score(report, "copying", 0, head).role == "copy"
    for head in (2, 3):  # KV group 1: W_V = -I
        assert _score(report, "suppression", 0, head).score == 1.0
        assert _score(report, "copying", 0, head).score == 0.0
        assert _score(report, "eigenvalue", 0, head).score == pytest.approx(-1.0)
        assert _score(report, "suppression", 0, head).role == "supp"


def test_successor_permutation_scores_one(hand_set):
    _, report = hand_set
    row = _score(report, "successor", 1, 0, data="toy")
    assert row.score == 1.0
    assert row.baseline == pytest.approx(0.1)  # 1 / task size
    assert row.n == 9  # pairs w10->w11 ... w18->w19
    assert row.role == "succ"
    # The successor head does not copy: its own token is never in its top-5 outside the task.
    assert _score(report, "copying", 1, 0).role == ""
    # Identity heads point at the member itself, never at its successor.
    assert _score(report, "successor", 0, 0, data="toy").score == 0.0


def test_random_ov_stays_near_its_baseline(hand_set):
    _, report = hand_set
    baseline = 5 / V
    for head in (1, 2):
        row = _score(report, "copying", 1, head)
        assert row.role == ""
        assert row.ci_low <= baseline + 0.05
        assert abs(row.score - baseline) < 0.12
        succ = _score(report, "successor", 1, head, data="toy")
        assert succ.role == ""
        assert succ.ci_low <= 0.1 + 0.05


def test_scores_are_shares_with_intervals(hand_set):
    _, report = hand_set
    table = report.table
    shares = table[table.relation != "eigenvalue"]
    assert shares.score.between(0, 1).all()
    assert (shares.ci_low <= shares.score + 1e-12).all() and (shares.score <= shares.ci_high + 1e-12).all()
    eig = table[table.relation == "eigenvalue"]
    assert eig.score.between(-1, 1).all() and eig.ci_low.isna().all()
    assert (table[table.relation == "copying"].baseline - 5 / V).abs().max() < 1e-12


def test_gqa_each_query_head_uses_its_own_groups_value_weights():
    loaded = toy(n_kv=2, n_heads=4)
    attention = loaded.model.model.layers[0].self_attn
    circuits = Circuits(loaded)
    layer = circuits.layer(0)
    v_weight = attention.v_proj.weight.detach()  # [kv * Dh, D]
    o_weight = attention.o_proj.weight.detach()  # [D, H * Dh]
    for head in range(4):
        group = head // 2
        by_hand = v_weight[group * V : (group + 1) * V].T @ o_weight[:, head * V : (head + 1) * V].T
        torch.testing.assert_close(layer.matrix(head, 2), by_hand)
    # Heads 0 and 2 differ in W_V: their OV matrices differ even with W_O[0] set equal to W_O[2].
    with torch.no_grad():
        o_weight_shared = o_weight[:, 0:V].clone()
        attention.o_proj.weight[:, 2 * V : 3 * V] = o_weight_shared
    layer = Circuits(loaded).layer(0)
    assert not torch.allclose(layer.matrix(0, 2), layer.matrix(2, 2))


def test_rank_tests_match_a_full_sort():
    generator = torch.Generator().manual_seed(5)
    n, d_head, d, vocab = 40, 32, 32, 5000
    values = torch.randn(n, d_head, generator=generator)
    w_o = torch.randn(d_head, d, generator=generator)
    unembed = torch.randn(vocab, d, generator=generator)
    own = torch.randint(vocab, (n,), generator=generator)
    # Half the rows copy strongly, so both the early stop and the full pass are exercised.
    values[: n // 2] = unembed[own[: n // 2]] @ torch.linalg.inv(w_o)
    candidates = Candidates.of(torch.arange(vocab), unembed, generator)
    for k in (1, 5, 50):
        top, bottom = rank_tests(values, w_o, unembed[own], own, candidates, k)
        logits = values @ w_o @ unembed.T
        ranks_high = (logits > logits.gather(1, own[:, None])).sum(1)
        ranks_low = (logits < logits.gather(1, own[:, None])).sum(1)
        assert torch.equal(top, ranks_high < k)
        assert torch.equal(bottom, ranks_low < k)
        assert top[: n // 2].all()


def test_mlp0_embedding_reads_block_zero_alone(hand_set):
    loaded, _ = hand_set
    circuits = Circuits(loaded)
    ids = torch.tensor([3, 7, 11])
    raw, effective = circuits.embeddings(ids, "mlp0")
    # By hand: each token alone through block 0, as a one-token sequence.
    with torch.no_grad():
        out = loaded.model.model(input_ids=ids[:, None], output_hidden_states=True)
    torch.testing.assert_close(effective, out.hidden_states[1][:, 0].float())
    torch.testing.assert_close(raw, torch.eye(V)[ids])


@pytest.mark.parametrize("arch", ["gemma3", "gpt2"])
def test_folded_circuit_matches_the_modules_themselves(arch):
    """Gemma 3 ((1 + w) norms, √d embedding scale, post-attention norm, tied unembedding, MQA) and
    GPT-2 (LayerNorm with centring and bias, Conv1D): the folded circuit's logits equal those of
    the model's own modules applied to one head's output, up to a positive factor per token."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    if arch == "gemma3":
        config = Gemma3TextConfig(
            vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, head_dim=8,
        )  # fmt: skip
        model = Gemma3ForCausalLM(config).eval()
    else:
        config = GPT2Config(vocab_size=80, n_embd=32, n_layer=2, n_head=4, n_positions=32)
        model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for module in model.modules():
            name = type(module).__name__
            if name.endswith("RMSNorm") and module.weight.dim() == 1:
                module.weight.uniform_(-0.5, 0.5)
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.2)
    loaded = hs.load(model, _tokenizer(), name="toy")
    circuits = Circuits(loaded)
    ids = torch.arange(1, 80)  # Gemma's id 0 is padding, embedded as zeros
    raw, effective = circuits.embeddings(ids, "raw")
    base = model.base_model
    blocks = base.layers if arch == "gemma3" else base.h
    final = base.norm if arch == "gemma3" else base.ln_f
    d_head = loaded.layout.head_dim
    for index in range(2):
        layer = circuits.layer(index)
        ours_in = circuits.layer_inputs(layer, index, raw, effective)
        block = blocks[index]
        with torch.no_grad():
            x = (block.input_layernorm if arch == "gemma3" else block.ln_1)(raw)
            torch.testing.assert_close(ours_in, x)
            for head in range(4):
                if arch == "gemma3":
                    v = block.self_attn.v_proj(x)[:, :d_head]  # the single KV head (MQA)
                    out = v @ block.self_attn.o_proj.weight[:, head * d_head : (head + 1) * d_head].T
                    out = block.post_attention_layernorm(out)
                else:
                    qkv = block.attn.c_attn(x) - block.attn.c_attn.bias
                    v = qkv[:, 64 + head * d_head : 64 + (head + 1) * d_head]
                    out = v @ block.attn.c_proj.weight[head * d_head : (head + 1) * d_head]
                normed = final(out)
                if arch == "gpt2":
                    normed = normed - final.bias
                reference = normed @ model.get_output_embeddings().weight.T
                group = head // loaded.layout.group_size
                ours = (x @ layer.w_v[group]) @ layer.w_o[head] @ circuits.unembed.T
                ratio = reference.norm(dim=1) / ours.norm(dim=1)
                torch.testing.assert_close(reference, ours * ratio[:, None], rtol=1e-4, atol=1e-4)
                assert (ratio > 0).all()
