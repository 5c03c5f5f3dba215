"""Token ↔ word alignment from tokenizer offset mappings, and word-level attention.

A word (or any mention) is a character span ``[start, end)`` of the text the tokenizer read.

* Attention **to** a word is the **sum** over its tokens. A token that covers characters of two
  words (byte-level BPE can merge "的画" into one token) gives each word the share of its
  in-word characters, so mass is never counted twice; characters outside every span (spaces)
  do not count.
* Attention **from** a word is the **mean** over the rows of the tokens that overlap it.
* Special tokens (BOS, CLS, SEP, pad) and zero-width offsets belong to no word, so attention to
  them drops out of the word distribution (rows need not sum to 1 afterwards; argmax does not care).

Byte-level tokenizers can emit several tokens for one character (a CJK character in two byte
tokens); each carries that character's offsets, and each counts fully towards its word.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headscope.errors import InputError

Span = tuple[int, int]


class AlignmentError(InputError):
    """A span that no token covers, or a span outside the text."""


def token_word_maps(
    offsets: Sequence[Span], special: Sequence[bool], spans: Sequence[Span], text_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(to_word [T, W], from_word [T, W])``.

    ``to_word[t, w]`` is the share of token t's in-span characters inside span w (rows sum to 1
    or 0); ``attn_to_words = attn @ to_word``. ``from_word[:, w]`` averages the rows of the tokens
    that overlap span w (columns sum to 1); ``word_rows = from_word.T @ attn``.
    """
    n_tokens, n_words = len(offsets), len(spans)
    for w, (start, end) in enumerate(spans):
        if not 0 <= start < end or (text_length is not None and end > text_length):
            raise AlignmentError(
                f"span {w} [{start}, {end}) is empty or outside the text (length {text_length})"
            )
    overlap = torch.zeros(n_tokens, n_words, dtype=torch.float32)
    for t, ((t_start, t_end), is_special) in enumerate(zip(offsets, special, strict=True)):
        if is_special or t_end <= t_start:
            continue
        for w, (start, end) in enumerate(spans):
            shared = min(t_end, end) - max(t_start, start)
            if shared > 0:
                overlap[t, w] = shared
    missing = (overlap.sum(0) == 0).nonzero().flatten().tolist()
    if missing:
        w = missing[0]
        raise AlignmentError(f"span {w} {tuple(spans[w])} is covered by no token")
    row_total = overlap.sum(1, keepdim=True)
    to_word = torch.where(row_total > 0, overlap / row_total.clamp(min=1e-9), torch.zeros_like(overlap))
    member = (overlap > 0).float()
    from_word = member / member.sum(0, keepdim=True)
    return to_word, from_word


def encode_with_offsets(tokenizer: object, text: str) -> tuple[list[int], list[bool], list[Span]]:
    """Tokenize ``text`` with the tokenizer's special tokens: ids, special mask, character offsets."""
    enc = tokenizer(  # type: ignore[operator]
        text, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True
    )
    ids = list(enc["input_ids"])
    special = [bool(s) for s in enc["special_tokens_mask"]]
    offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    return ids, special, offsets


def encode_with_spans(
    tokenizer: object, text: str, spans: Sequence[Span]
) -> tuple[list[int], list[bool], torch.Tensor, torch.Tensor]:
    """Tokenize ``text`` and align ``spans``: ids, special mask, to_word, from_word."""
    ids, special, offsets = encode_with_offsets(tokenizer, text)
    to_word, from_word = token_word_maps(offsets, special, spans, len(text))
    return ids, special, to_word, from_word


def word_tokens(from_word: torch.Tensor, word: int) -> torch.Tensor:
    """The token positions that overlap span ``word`` (1-D, ascending)."""
    return (from_word[:, word] > 0).nonzero().flatten()


def share_a_token(from_word: torch.Tensor, a: int, b: int) -> bool:
    """Whether one token covers characters of both spans (their attention cannot be told apart)."""
    return bool(((from_word[:, a] > 0) & (from_word[:, b] > 0)).any())


def precedes(from_word: torch.Tensor, earlier: int, later: int) -> bool:
    """Whether every token of span ``earlier`` comes before every token of span ``later``: what a
    causal model must see for ``later``'s tokens to attend to all of ``earlier``."""
    return int(word_tokens(from_word, earlier).max()) < int(word_tokens(from_word, later).min())


def word_attention(attn: torch.Tensor, to_word: torch.Tensor, from_word: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, T]`` token attention → ``[B, H, W, W]`` word attention (padded maps are zero)."""
    to_words = torch.matmul(attn, to_word[:, None].to(attn.dtype))  # [B, H, T, W]
    return torch.matmul(from_word[:, None].transpose(-1, -2).to(attn.dtype), to_words)


def pad_maps(maps: Sequence[torch.Tensor], length: int) -> torch.Tensor:
    """Stack per-row ``[T_i, W_i]`` maps into ``[B, length, max W]`` with zero padding."""
    width = max(m.shape[1] for m in maps)
    out = torch.zeros(len(maps), length, width, dtype=torch.float32)
    for row, m in enumerate(maps):
        out[row, : m.shape[0], : m.shape[1]] = m
    return out
