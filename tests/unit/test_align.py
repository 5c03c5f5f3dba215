"""Token ↔ word alignment, hand-checked on real tokenizers (WordPiece, byte-level BPE, Chinese)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from headscope.data.align import AlignmentError, encode_with_spans, token_word_maps, word_attention
from headscope.models import bundled_path


@pytest.fixture(scope="module")
def wordpiece():
    return AutoTokenizer.from_pretrained(str(bundled_path("minilm-l6")))


def words_of(text: str, forms: list[str]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for form in forms:
        start = text.index(form, start)
        spans.append((start, start + len(form)))
        start += len(form)
    return spans


def test_wordpiece_split_word_and_special_tokens(wordpiece):
    text = "The unbelievably heavy door opened."
    spans = words_of(text, ["The", "unbelievably", "heavy", "door", "opened", "."])
    ids, special, to_word, from_word = encode_with_spans(wordpiece, text, spans)
    tokens = wordpiece.convert_ids_to_tokens(ids)
    assert tokens == [
        "[CLS]",
        "the",
        "un",
        "##bel",
        "##ie",
        "##va",
        "##bly",
        "heavy",
        "door",
        "opened",
        ".",
        "[SEP]",
    ]
    assert special[0] and special[-1]
    # [CLS] and [SEP] belong to no word; "unbelievably" owns five pieces.
    assert to_word[0].sum() == 0 and to_word[-1].sum() == 0
    assert to_word[2:7, 1].tolist() == [1.0] * 5
    assert to_word.argmax(1)[1:-1].tolist() == [0, 1, 1, 1, 1, 1, 2, 3, 4, 5]
    assert from_word[:, 1].tolist() == pytest.approx([0, 0] + [0.2] * 5 + [0] * 5)


def test_chinese_characters_and_unknowns(wordpiece):
    text = "小明喜欢画"
    spans = words_of(text, ["小明", "喜欢", "画"])
    ids, special, to_word, _ = encode_with_spans(wordpiece, text, spans)
    # One token per character, [UNK] or not, each mapped to its word.
    assert to_word.argmax(1)[1:-1].tolist() == [0, 0, 1, 1, 2]
    assert to_word[1:-1].sum(1).tolist() == [1.0] * 5


def test_byte_level_bpe_shares_and_leading_spaces():
    # Offsets as a byte-level BPE tokenizer emits them: "Ġworld" covers the space before it,
    # two byte tokens share one CJK character, and one token "的画" covers two words.
    text = "Hi world 的画"
    offsets = [(0, 2), (2, 8), (8, 10), (9, 10), (9, 11)]
    special = [False] * 5
    spans = [(0, 2), (3, 8), (9, 10), (10, 11)]
    to_word, from_word = token_word_maps(offsets, special, spans, len(text))
    assert to_word[1].tolist() == [0, 1, 0, 0]  # the space is in no word
    assert to_word[2].tolist() == [0, 0, 1, 0]
    assert to_word[3].tolist() == [0, 0, 1, 0]
    assert to_word[4].tolist() == [0, 0, 0.5, 0.5]  # the shared token splits its mass
    # From-word: 的 averages its three tokens; 画 has only the shared one.
    assert from_word[:, 2].tolist() == pytest.approx([0, 0, 1 / 3, 1 / 3, 1 / 3])
    assert from_word[:, 3].tolist() == [0, 0, 0, 0, 1]


def test_word_attention_sums_to_and_averages_from():
    offsets = [(0, 0), (0, 2), (2, 4), (5, 8)]  # BOS, "ab", "cd" (one word "abcd"), "efg"
    to_word, from_word = token_word_maps(offsets, [True, False, False, False], [(0, 4), (5, 8)], 8)
    attn = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1, 0.2, 0.3, 0.4]])[
        None, None
    ]
    words = word_attention(attn, to_word[None], from_word[None])[0, 0]
    # from "abcd" = mean of rows 1 and 2, to "abcd" = columns 1 + 2
    assert words[0, 0].item() == pytest.approx(((0.5 + 0) + (0.3 + 0.5)) / 2)
    assert words[1, 0].item() == pytest.approx(0.2 + 0.3)
    assert words[1, 1].item() == pytest.approx(0.4)


def test_uncovered_or_outside_spans_are_rejected():
    with pytest.raises(AlignmentError, match="covered by no token"):
        token_word_maps([(0, 2)], [False], [(0, 2), (3, 4)], 4)
    with pytest.raises(AlignmentError, match="outside the text"):
        token_word_maps([(0, 2)], [False], [(0, 9)], 4)
