"""Syntax and coreference scorers on synthetic attention with planted answers."""

from __future__ import annotations

import pytest
import torch

from headscope.capture import make_batches
from headscope.detectors.coref import CorefDetector
from headscope.detectors.syntax import SyntaxDetector
from headscope.models import HeadLayout

LAYOUT = HeadLayout(n_layers=1, n_heads=3, n_kv_heads=3, head_dim=4, d_model=12, max_positions=None)


def one_token_per_word(n: int) -> dict:
    eye = torch.eye(n)
    return {"to_word": eye, "from_word": eye}


def batch_for(sentences: list[list[tuple[int, int, str]]], lengths: list[int], causal: bool):
    metas = [dict(one_token_per_word(n), arcs=arcs) for arcs, n in zip(sentences, lengths, strict=True)]
    seqs = [list(range(10, 10 + n)) for n in lengths]
    specials = [[False] * n for n in lengths]
    return make_batches(
        seqs, specials, batch_size=len(seqs), pad_id=0, is_causal=causal, meta=metas, sort_by_length=False
    )[0]


def attention_to(targets: torch.Tensor, length: int) -> torch.Tensor:
    """[T, T] rows putting 0.9 on targets[i] and spreading 0.1 over the rest."""
    attn = torch.full((length, length), 0.1 / (length - 1))
    attn[torch.arange(length), targets] = 0.9
    return attn


def test_syntax_planted_head_and_offset_baseline_encoder():
    # "the dog saw a cat": det(dog<-the) nsubj(saw<-dog) det(cat<-a) obj(saw<-cat)
    arcs = [(0, 1, "det"), (1, 2, "nsubj"), (3, 4, "det"), (4, 2, "obj")]
    batch = batch_for([arcs], [5], causal=False)
    gold_head = torch.tensor([1, 2, 1, 4, 2])  # each word's head (the root points at a neighbour)
    planted = attention_to(gold_head, 5)
    wrong = attention_to(torch.tensor([4, 4, 4, 0, 0]), 5)
    attn = torch.stack([wrong, planted, wrong])[None]
    detector = SyntaxDetector(["det", "nsubj", "obj"])
    detector.start(LAYOUT, 1)
    before = attn.clone()
    detector.consume(0, attn, batch)
    assert torch.equal(attn, before)
    results = {(r.relation, r.direction): r for r in detector.results("toy")}
    det = results[("det", "dep->head")]
    assert det.n == 2
    assert det.scores()[0].tolist() == [0.0, 1.0, 0.0]
    assert det.baseline() == pytest.approx(1.0) and det.baseline_label == "offset +1"
    obj = results[("obj", "dep->head")]
    assert obj.scores()[0, 1] == 1.0 and obj.baseline_label == "offset -2"
    # The reverse direction is scored too in an encoder: the head's own argmax.
    assert ("obj", "head->dep") in results and results[("obj", "head->dep")].n == 1


def test_syntax_causal_visibility():
    arcs = [(0, 1, "det"), (1, 2, "nsubj"), (3, 4, "det"), (4, 2, "obj")]
    batch = batch_for([arcs], [5], causal=True)
    # Causal rows: word i attends to the dependent that precedes it when there is one.
    attn = torch.zeros(1, 3, 5, 5)
    for i, target in enumerate([0, 0, 1, 2, 3]):
        attn[0, :, i, target] = 1.0
    detector = SyntaxDetector(["det", "nsubj", "obj"])
    detector.start(LAYOUT, 1)
    detector.consume(0, attn, batch)
    keys = {(r.relation, r.direction): r for r in detector.results()}
    # det/nsubj heads come after their dependents: only head->dep is visible; obj is the reverse.
    assert set(keys) == {("det", "head->dep"), ("nsubj", "head->dep"), ("obj", "dep->head")}
    assert set(detector.unscored()) == {("det", "dep->head"), ("nsubj", "dep->head"), ("obj", "head->dep")}
    assert keys[("det", "head->dep")].scores()[0, 0] == 1.0  # dog->the, cat->a
    assert keys[("nsubj", "head->dep")].scores()[0, 0] == 1.0  # saw->dog
    assert keys[("obj", "dep->head")].scores()[0, 0] == 0.0  # cat->a, not saw


def test_syntax_padding_and_examples_are_separate():
    batch = batch_for([[(0, 1, "det")], [(0, 1, "det"), (2, 1, "obj")]], [2, 3], causal=False)
    attn = torch.zeros(2, 3, 3, 3)
    attn[:, :, 0, 1] = 1.0  # word 0 -> word 1 everywhere
    attn[:, :, 1, 0] = 1.0
    attn[:, :, 2, 1] = 1.0
    detector = SyntaxDetector(["det", "obj"])
    detector.start(LAYOUT, 2)
    detector.consume(0, attn, batch)
    det = {(r.relation, r.direction): r for r in detector.results()}[("det", "dep->head")]
    assert det.counts.tolist() == [1.0, 1.0]
    assert det.sums[:, 0, 0].tolist() == [1.0, 1.0]


def coref_batch(causal: bool):
    # spans: pronoun, candidate 0, candidate 1 -> one token each; antecedent is candidate 0.
    metas = [
        {
            "to_word": torch.eye(3)[[1, 2, 0]],  # tokens: cand0, cand1, pronoun
            "from_word": torch.eye(3)[[1, 2, 0]],
            "visible": [True, True],
            "antecedent": 0,
            "nearest": 1,
        },
        {
            "to_word": torch.eye(3)[[1, 2, 0]],
            "from_word": torch.eye(3)[[1, 2, 0]],
            "visible": [True, True],
            "antecedent": 1,
            "nearest": 1,
        },
    ]
    return make_batches(
        [[5, 6, 7]] * 2,
        [[False] * 3] * 2,
        batch_size=2,
        pad_id=0,
        is_causal=causal,
        meta=metas,
        sort_by_length=False,
    )[0]


def test_coref_planted_head_nearest_baseline_and_chance():
    batch = coref_batch(causal=True)
    attn = torch.zeros(2, 3, 3, 3)
    attn[:, :, :, 0] = 1.0  # default: everything to token 0
    attn[0, 1, 2] = torch.tensor([0.7, 0.2, 0.1])  # head 1, example 0: pronoun -> candidate 0 (right)
    attn[1, 1, 2] = torch.tensor([0.1, 0.8, 0.1])  # head 1, example 1: pronoun -> candidate 1 (right)
    detector = CorefDetector()
    detector.start(LAYOUT, 2)
    detector.consume(0, attn, batch)
    (result,) = detector.results("toy")
    assert result.scores()[0].tolist() == [0.5, 1.0, 0.5]
    assert result.baseline() == pytest.approx(0.5)  # nearest is right on example 1 only
    assert result.extras["chance"] == pytest.approx(0.5)
    assert result.n == 2


@pytest.mark.parametrize("causal", [True, False])
def test_word_level_detectors_accept_query_chunks(causal):
    """Syntax and coref sum the word map over query chunks and score it at the end of the layer."""
    arcs = [(0, 1, "det"), (1, 2, "nsubj"), (3, 4, "det"), (4, 2, "obj")]
    batch = batch_for([arcs, arcs[:2]], [5, 3], causal=causal)
    generator = torch.Generator().manual_seed(3)
    attn = torch.softmax(torch.randn(2, 3, 5, 5, generator=generator), -1)
    if causal:
        attn = attn.tril()
        attn = attn / attn.sum(-1, keepdim=True)
    for make, chosen in [(lambda: SyntaxDetector(["det", "nsubj", "obj"]), batch), (CorefDetector, None)]:
        chosen = chosen or coref_batch(causal)
        data = attn[:, :, :3, :3] / attn[:, :, :3, :3].sum(-1, keepdim=True) if chosen is not batch else attn
        whole, chunked = make(), make()
        whole.start(LAYOUT, 2)
        chunked.start(LAYOUT, 2)
        whole.consume(0, data, chosen)
        length = data.shape[2]
        for start in range(0, length, 2):
            stop = min(length, start + 2)
            keys = stop if causal else length
            chunked.update(0, data[:, :, start:stop, :keys], chosen, start)
        chunked.end_layer(0, chosen)
        for a, b in zip(whole.results(), chunked.results(), strict=True):
            assert (a.relation, a.direction) == (b.relation, b.direction)
            assert torch.equal(a.sums, b.sums) and torch.equal(a.counts, b.counts)
