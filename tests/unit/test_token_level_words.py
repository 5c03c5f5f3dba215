"""Visibility and self-exclusion are decided on tokens, not characters: a token that covers two
words (BPE merges such as 的画) must not pass its attention to itself on to the other word."""

from __future__ import annotations

import dataclasses

import torch

from headscope import analyses
from headscope.capture import make_batches
from headscope.data.align import precedes, share_a_token, token_word_maps
from headscope.data.prompts import CorefItem, CorefSet
from headscope.detectors.words import WordLevelDetector
from headscope.models import HeadLayout

LAYOUT = HeadLayout(n_layers=1, n_heads=1, n_kv_heads=1, head_dim=4, d_model=4, max_positions=None)


class _Capture(WordLevelDetector):
    name = "capture-words"
    summary = "test only"

    def score_words(self, layer, scores, batch):
        self.words = scores.clone()


def test_a_token_shared_by_two_words_passes_no_self_attention_between_them():
    # Text "ab c": token 0 covers words "a" [0,1) and "b" [1,2); token 1 covers word "c" [3,4).
    offsets, special, spans = [(0, 2), (3, 4)], [False, False], [(0, 1), (1, 2), (3, 4)]
    to_word, from_word = token_word_maps(offsets, special, spans, 4)
    assert share_a_token(from_word, 0, 1) and not share_a_token(from_word, 1, 2)
    assert precedes(from_word, 1, 2) and not precedes(from_word, 0, 1)
    batch = make_batches([[5, 6]], [[False, False]], batch_size=1, pad_id=0, is_causal=False)[0]
    batch.meta = [{"to_word": to_word, "from_word": from_word}]
    detector = _Capture()
    detector.start(LAYOUT, 1)
    # Pure self-attention: every token looks only at itself.
    detector.consume(0, torch.eye(2)[None, None], batch)
    words = detector.words[0, 0]
    # Word "a" gives word "b" nothing (before: 0.5, half of token 0's self-attention).
    assert words[0, 1].item() == 0.0 and words[1, 0].item() == 0.0
    assert words.abs().max().item() == 0.0
    # Real attention between tokens still reaches the words: token 1 -> token 0 splits over a and b.
    detector.consume(0, torch.tensor([[1.0, 0.0], [1.0, 0.0]])[None, None], batch)
    assert torch.allclose(detector.words[0, 0, 2], torch.tensor([0.5, 0.5, 0.0]))


class _GluingTokenizer:
    """Whitespace-separated chunks are tokens; "t3t5" is one token covering two toy symbols."""

    pad_token_id = 0
    eos_token_id = 2

    def __call__(self, text, **_):
        ids, offsets, start = [], [], 0
        for chunk in text.split(" "):
            ids.append(5 + len(ids) % 50)
            offsets.append((start, start + len(chunk)))
            start += len(chunk) + 1
        return {
            "input_ids": ids,
            "offset_mapping": offsets,
            "special_tokens_mask": [0] * len(ids),
        }


def test_coref_leaves_out_a_candidate_merged_into_the_pronoun(toy):
    loaded = dataclasses.replace(toy, tokenizer=_GluingTokenizer())
    items = [
        # Characters say t3 [6, 8) ends before the pronoun t5 [9, 11): visible, so the old rule kept it.
        CorefItem(f"ok{i}", "t1 t2 t3 t5 t6", (9, 11), ((0, 2), (6, 8)), i % 2, source=f"x:{i}")
        for i in range(6)
    ]
    # Here t3 and the pronoun are one token "t3t5": t3 would receive the pronoun's self-attention.
    items.append(CorefItem("glued", "t1 t2 t3t5 t6", (8, 10), ((0, 2), (6, 8)), 1, source="x:7"))
    report = analyses.coref(loaded, CorefSet("glue", items, "glue.yaml"), n_resamples=200)
    assert report.sections[0].n == 6
    assert any(
        "excluded 1 examples in which a candidate shares a token with the pronoun" in n for n in report.notes
    )
