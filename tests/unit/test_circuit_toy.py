"""Retrieval heads on the trained toy, whose heads we know: its layer-1 heads are induction heads
(they attend to the token after an earlier copy of the current token) and its layer-0 heads look at
the previous token. A needle-in-a-haystack prompt of its own symbols makes the induction heads
copy the answer out of the needle, so they must come out as retrieval heads and layer 0 must not.
"""

from __future__ import annotations

import random

import torch

from headscope.analyses.retrieval import NeedlePrompt, score_prompts
from headscope.detectors.circuits import RetrievalDetector

SYMBOLS = [f"t{i}" for i in range(56)]


def toy_needle_prompts(toy, n_needles: int = 8, seed: int = 0) -> list[NeedlePrompt]:
    """Haystack symbols, a needle of 8 symbols at a random depth, more haystack, then the needle's
    first 4 symbols (the "question") after which the model should continue with the other 4."""
    rng = random.Random(seed)
    tokenizer = toy.tokenizer
    prompts = []
    for index in range(n_needles):
        needle = rng.sample(SYMBOLS, 8)
        others = [s for s in SYMBOLS if s not in needle]
        before = [rng.choice(others) for _ in range(rng.randrange(10, 40))]
        after = [rng.choice(others) for _ in range(rng.randrange(10, 30))]
        words = before + needle + after + needle
        enc = tokenizer(" ".join(words), add_special_tokens=True, return_special_tokens_mask=True)
        ids = list(enc["input_ids"])
        special = [bool(s) for s in enc["special_tokens_mask"]]
        assert len(ids) == len(words) + sum(special)  # one token per symbol
        shift = sum(special[: len(ids) - len(words)])
        needle_start = shift + len(before)
        answer = [len(ids) - 4 + j for j in range(4)]
        queries = [a - 1 for a in answer]
        gold = [ids[a] for a in answer]
        needle_keys = [[needle_start + 4 + j] for j in range(4)]
        assert [ids[k[0]] for k in needle_keys] == gold
        prompts.append(NeedlePrompt(index, len(ids), 0.5, ids, special, queries, gold, needle_keys))
    return prompts


def test_the_toy_induction_heads_are_its_retrieval_heads(toy, toy_truth):
    prompts = toy_needle_prompts(toy)
    report, outcome, _ = score_prompts(toy, prompts, len(prompts), "toy-needles", "toy", n_resamples=500)
    assert outcome.accuracy >= 0.75, outcome  # the toy copies the needle's continuation
    table = report.table.set_index(["layer", "head"])
    layer1 = table.loc[1].score
    layer0 = table.loc[0].score
    assert layer1.max() >= 0.9, table.score
    assert layer0.max() <= 0.1, table.score
    retrieval = set(table[table.role == "retr"].index)
    induction_head = tuple(toy_truth["induction_head"])
    assert induction_head in retrieval
    assert all(layer == 1 for layer, _ in retrieval)
    # The reference is uniform attention over the visible keys: one needle key among dozens.
    assert 0.0 < float(table.baseline.max()) < 0.05
    # n counts only answer positions the model got right.
    assert table.n.iloc[0] == outcome.counted <= sum(len(p.queries) for p in prompts)


def test_a_wrong_prediction_is_not_counted_even_when_the_head_looks_at_the_needle(toy):
    """The detector counts a hit only where the model's own top-1 prediction was right."""
    from headscope import capture

    prompt = toy_needle_prompts(toy, n_needles=1)[0]
    batch = capture.make_batches([prompt.ids], [prompt.special], batch_size=1, pad_id=0, is_causal=True)[0]
    batch.meta[0].update({"queries": prompt.queries, "needle_keys": prompt.needle_keys})
    detector = RetrievalDetector()
    detector.start(toy.layout, 1)
    length = len(prompt.ids)
    attn = torch.zeros(1, toy.layout.n_heads, length, length)
    attn[..., 0] = 1.0  # every head on BOS ...
    for query, keys in zip(prompt.queries, prompt.needle_keys, strict=True):
        attn[0, 2, query, :] = 0.0
        attn[0, 2, query, keys[0]] = 1.0  # ... except head 2, which looks at the needle token
    detector.update(0, attn, batch, 0)
    detector.update(1, attn, batch, 0)
    correct = {(0, q): i != 1 for i, q in enumerate(prompt.queries)}  # the second answer token was wrong
    detector.settle(batch, correct)
    result = detector.results("synthetic")[0]
    assert result.n == 3
    assert result.scores()[:, 2].tolist() == [1.0, 1.0]
    assert float(result.scores()[:, [0, 1, 3]].abs().sum()) == 0.0
