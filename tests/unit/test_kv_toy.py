"""The hand-built KV toy (tests/toy/kv_toy.py): its planted heads do what its docstring says.

Full attention solves every needle; limiting the planted streaming KV heads to a sink and a recent
window changes nothing; limiting either planted retrieval KV head breaks the answer token it
retrieves.
"""

from __future__ import annotations

import pytest
import torch
from conftest import kv_toy_module
from transformers import AutoTokenizer, LlamaForCausalLM

from headscope.data.circuits import load_haystack, load_retrieval

kv = kv_toy_module()

DEPTHS = (0.0, 0.25, 0.5, 0.75)
N_NEEDLES = 6
SENTENCES = 36  # about 300 tokens per prompt
SINK, RECENT = 4, 16


def build_prompt(item, sentences: list[str], depth: float) -> str:
    """The template of the code under test; depth 0 still puts one sentence before the needle,
    so that the needle never falls in the attention sink."""
    at = max(1, round(depth * len(sentences)))
    haystack = " ".join(sentences[:at] + [item.needle] + sentences[at:])
    return haystack + "\n\nQuestion: " + item.question + "\nAnswer: " + item.answer_prefix + item.answer


@pytest.fixture(scope="module")
def toy():
    return kv.build_kv_toy()


@pytest.fixture(scope="module")
def needles(tmp_path_factory):
    return load_retrieval(kv.write_needles(tmp_path_factory.mktemp("kv") / "needles.yaml")).items


@pytest.fixture(scope="module")
def prompts(toy, needles):
    """(input ids [1, n], position of the needle's v token, v id, w id) for each prompt."""
    out = []
    for i, item in enumerate(needles[:N_NEEDLES]):
        for j, depth in enumerate(DEPTHS):
            text = build_prompt(item, kv.haystack_lines(SENTENCES, seed=10 * i + j), depth)
            ids = toy.tokenizer(text, return_tensors="pt").input_ids
            v_id, w_id = toy.tokenizer.convert_tokens_to_ids(item.answer.split())
            assert ids[0, -2:].tolist() == [v_id, w_id]
            needle_v = (ids[0] == v_id).nonzero()[0].item()
            assert SINK <= needle_v < ids.shape[1] - 40
            out.append((ids, needle_v, v_id, w_id))
    return out


def answer_logits(model, prompts) -> list[torch.Tensor]:
    """Logits [2, vocab] at the two teacher-forced answer positions of each prompt."""
    with torch.no_grad():
        return [model(ids).logits[0, -3:-1] for ids, *_ in prompts]


def correct(logits: list[torch.Tensor], prompts) -> torch.Tensor:
    """Bool [prompts, 2]: whether each answer token is top-1."""
    return torch.tensor(
        [
            [lg[0].argmax().item() == v, lg[1].argmax().item() == w]
            for lg, (_, _, v, w) in zip(logits, prompts, strict=True)
        ]
    )


@pytest.fixture(scope="module")
def full(toy, prompts):
    toy.model.set_attn_implementation("eager")
    return answer_logits(toy.model, prompts)


def run_streaming(toy, prompts, streaming):
    with kv.reference_streaming(toy.model, streaming, sink=SINK, recent=RECENT):
        logits = answer_logits(toy.model, prompts)
    assert toy.model.config._attn_implementation == "eager"
    return logits


def test_config_and_tokenizer(toy):
    config = toy.model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (2, 4, 2)
    assert config.max_position_embeddings >= 2048 and not config.tie_word_embeddings
    assert toy.model.dtype == torch.float32
    assert toy.retrieval_kv == {(0, 0), (1, 1)} and toy.streaming_kv == {(0, 1), (1, 0)}
    enc = toy.tokenizer(
        "code v3 w5 . Question:", return_offsets_mapping=True, return_special_tokens_mask=True
    )
    assert enc.input_ids[0] == toy.tokenizer.bos_token_id
    assert enc.special_tokens_mask == [1, 0, 0, 0, 0, 0]
    assert enc.offset_mapping[1:] == [(0, 4), (5, 7), (8, 10), (11, 12), (13, 22)]
    assert toy.tokenizer.pad_token == "<pad>"


def test_needles_and_haystack(needles, tmp_path):
    assert len(needles) == 8 and all(len(item.answer.split()) == 2 for item in needles)
    assert needles[0].answer_prefix == "code "
    lines = kv.haystack_lines(50)
    assert lines == kv.haystack_lines(50) and lines != kv.haystack_lines(50, seed=1)
    words = set(" ".join(lines).split())
    assert words <= set(kv.VOCAB) and not words & set(kv.V_TOKENS + kv.W_TOKENS)
    path = tmp_path / "haystack.txt"
    path.write_text("\n".join(lines) + "\n")
    assert load_haystack(path) == lines


def test_full_attention_solves_every_needle(full, prompts):
    assert correct(full, prompts).all()


def test_streaming_the_planted_streaming_heads_changes_nothing(toy, full, prompts):
    logits = run_streaming(toy, prompts, toy.streaming_kv)
    assert correct(logits, prompts).all()
    diff = max((a - b).abs().max().item() for a, b in zip(logits, full, strict=True))
    assert diff < 1e-4


def test_streaming_the_retrieval_heads_breaks_every_needle(toy, prompts):
    ok = correct(run_streaming(toy, prompts, toy.retrieval_kv), prompts)
    assert not ok.all(dim=1).any()  # accuracy 0.0
    assert not ok.any()  # neither answer token survives


def test_each_retrieval_head_is_necessary(toy, prompts):
    first = correct(run_streaming(toy, prompts, {(0, 0)}), prompts)
    assert not first[:, 0].any() and first[:, 1].all()
    second = correct(run_streaming(toy, prompts, {(1, 1)}), prompts)
    assert second[:, 0].all() and not second[:, 1].any()


def test_attention_maps(toy, prompts):
    toy.model.set_attn_implementation("eager")
    group = kv.N_HEADS // kv.N_KV
    for ids, needle_v, _, _ in prompts:
        with torch.no_grad():
            attentions = toy.model(ids, output_attentions=True).attentions
        for layer, kv_head in toy.streaming_kv:
            for head in range(kv_head * group, (kv_head + 1) * group):
                assert attentions[layer][0, head, :, 0].min().item() > 0.99
        layer, head = kv.HEAD_A
        assert attentions[layer][0, head, -3, needle_v].item() > 0.9


def test_reference_streaming_mask(toy, prompts):
    """With recent >= the length and no sink, the reference equals plain eager attention; with
    recent=1 and sink=1 every streaming query head sees only <bos> and itself."""
    ids = prompts[0][0]
    n = ids.shape[1]
    toy.model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = toy.model(ids).logits
        with kv.reference_streaming(toy.model, {(0, 0), (0, 1), (1, 0), (1, 1)}, sink=0, recent=n):
            same = toy.model(ids).logits
        with kv.reference_streaming(toy.model, {(0, 0)}, sink=1, recent=1):
            attn = toy.model(ids, output_attentions=True).attentions
    assert (same - eager).abs().max().item() < 1e-5
    visible = attn[0][0, 0] > 0
    assert visible.sum(-1).max().item() <= 2 and visible[:, 0].all()
    assert (attn[0][0, 2] > 0).sum(-1)[-1].item() > 2  # KV head 1 still sees everything
    padded = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    padded["attention_mask"][0, :3] = 0
    with kv.reference_streaming(toy.model, {(0, 0)}, sink=1, recent=1), pytest.raises(AssertionError):
        toy.model(**padded)


def test_save_and_load(toy, prompts, tmp_path):
    kv.save_kv_toy(tmp_path)
    model = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = prompts[0][0]
    assert tokenizer.decode(ids[0]) == toy.tokenizer.decode(ids[0])
    assert tokenizer("code v3").input_ids == toy.tokenizer("code v3").input_ids
    toy.model.set_attn_implementation("eager")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, toy.model(ids).logits)
