"""``show``: one text's attention maps, one forward pass, kept for one layer and the chosen heads.

The checks of ``show``'s inputs (text, heads, layer, word separators), the token and word views,
and the pass itself. Drawing them (terminal heatmaps, PNG, CSV rows) is :mod:`headscope.outputs.views`.
"""

from __future__ import annotations

import numbers
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headscope import capture
from headscope.data.align import AlignmentError, encode_with_offsets, token_word_maps, word_attention
from headscope.errors import InputError
from headscope.models import LoadedModel

from .base import check_context


@dataclass
class AttentionView:
    """One layer's attention on one text: ``weights[head, query, key]`` and labels for both axes."""

    layer: int
    heads: list[int]
    weights: torch.Tensor  # [len(heads), T, T] (tokens) or [len(heads), W, W] (words)
    labels: list[str]
    unit: str  # "token" or "word"

    def window(self, start: int, size: int) -> AttentionView:
        stop = min(len(self.labels), start + size)
        return AttentionView(
            self.layer,
            self.heads,
            self.weights[:, start:stop, start:stop],
            self.labels[start:stop],
            self.unit,
        )


def token_label(text: str, offsets: tuple[int, int], token: str, special: bool) -> str:
    """What a token looks like: its characters in the text, or the special token's name."""
    start, end = offsets
    if special or end <= start:
        return token
    piece = text[start:end]
    piece = piece.replace("\n", "⏎").replace("\t", "⇥")
    stripped = piece.strip(" ")
    return stripped if stripped else "␣"


def parse_heads(spec: str, n_heads: int | None) -> list[int]:
    """``--head``: one number, a comma list, or ``all``. Raises InputError naming the range.

    With ``n_heads`` None only the syntax is checked (``all`` gives an empty list).
    """
    spec = spec.strip()
    if spec.lower() == "all":
        return list(range(n_heads or 0))
    heads = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"-?[0-9]+", part):
            raise InputError(f"--head {spec!r}: {part!r} is not a head number", hint="e.g. 3, 0,2,5 or all")
        head = int(part)
        if n_heads is not None and not 0 <= head < n_heads:
            raise InputError(
                f"--head {head} is out of range: this model has heads 0..{n_heads - 1} per layer"
            )
        heads.append(head)
    if not heads:
        raise InputError("--head is empty", hint="e.g. 3, 0,2,5 or all")
    return list(dict.fromkeys(heads))


def check_text(text: str) -> None:
    if not isinstance(text, str):
        raise InputError(f"--text {text!r}: expected a string", hint="give some text to look at")
    if not text.strip():
        raise InputError("--text is empty", hint="give some text to look at")


def check_layer(layer: int, n_layers: int) -> None:
    # 1.5 would pass the range check and match no layer (an all-zero map); True would be layer 1
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise InputError(f"--layer {layer!r}: expected a whole number (a layer, 0-based)")
    if not 0 <= layer < n_layers:
        raise InputError(f"--layer {layer} is out of range: this model has layers 0..{n_layers - 1}")


def attention_view(
    loaded: LoadedModel, text: str, layer: int, heads: Sequence[int]
) -> tuple[AttentionView, dict]:
    """Run ``text`` once and keep layer ``layer``'s map for ``heads`` (token level).

    Returns the view and the encoding (ids, offsets, special mask) for word-level views.
    """
    check_layer(layer, loaded.layout.n_layers)
    check_text(text)
    ids, special, offsets = encode_with_offsets(loaded.tokenizer, text)
    if all(special):
        raise InputError(f"--text {text!r} tokenizes to no content tokens", hint="give some words")
    check_context(loaded, len(ids), "--text")
    batch = capture.make_batches([ids], [special], batch_size=1, pad_id=0, is_causal=loaded.is_causal)[0]
    length = len(ids)
    chosen = list(heads)
    weights = torch.zeros(len(chosen), length, length)  # keys a chunk does not see stay 0

    def on_layer(index: int, attn: torch.Tensor, _batch: capture.Batch, q_start: int) -> None:
        if index == layer:
            rows = attn.shape[2]
            weights[:, q_start : q_start + rows, : attn.shape[3]] = attn[0, chosen].cpu()

    capture.run(loaded, [batch], capture.Pass(reads=[capture.Attention(on_layer)]))
    tokens = loaded.tokenizer.convert_ids_to_tokens(ids)
    labels = [token_label(text, o, t, s) for o, t, s in zip(offsets, tokens, special, strict=True)]
    view = AttentionView(layer, chosen, weights, labels, "token")
    return view, {"ids": ids, "offsets": offsets, "special": special}


_CJK = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)  # Han and kana; Korean uses spaces


def _char_kind(ch: str) -> str:
    if ch.isspace():
        return "space"
    if _CJK.match(ch):
        return "cjk"
    if ch.isalnum() or unicodedata.category(ch).startswith("M"):
        return "word"
    return "other"


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of ``text``, for ``show --words``.

    A word is a run of letters and digits (with combining marks, and apostrophes between letters);
    every other visible character stands alone, and so does each CJK character, since Chinese and
    Japanese put no spaces between words (mark real word boundaries with ``--word-sep``).
    Combining marks, variation selectors and zero-width joiners stay with the character before.
    """
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        kind = _char_kind(text[i])
        if kind == "space":
            i += 1
            continue
        j = i + 1
        if kind == "word":
            while j < n and (
                _char_kind(text[j]) == "word"
                or (text[j] in "'’" and j + 1 < n and _char_kind(text[j + 1]) == "word")
            ):
                j += 1
        while j < n and (
            unicodedata.category(text[j]) in {"Mn", "Mc", "Me", "Cf"} or text[j - 1] == "\u200d"
        ):
            j += 1
        spans.append((i, j))
        i = j
    return spans


def split_marked(text: str, sep: str) -> tuple[str, list[tuple[int, int]]]:
    """``"我|喜欢|这幅|画"`` → ("我喜欢这幅画", spans of 我, 喜欢, 这幅, 画). Spaces stay in the text."""
    if not sep:
        raise InputError("--word-sep is empty", hint="give one character, e.g. '|'")
    pieces = text.split(sep)
    plain, spans, at = "", [], 0
    for piece in pieces:
        plain += piece
        stripped_start = len(piece) - len(piece.lstrip())
        stripped_end = len(piece.rstrip())
        if stripped_end > stripped_start:
            spans.append((at + stripped_start, at + stripped_end))
        at += len(piece)
    if not spans:
        raise InputError(f"--text has no words between the {sep!r} separators")
    return plain, spans


def to_words(
    view: AttentionView, text: str, encoding: dict, spans: Sequence[tuple[int, int]]
) -> AttentionView:
    """Token view → word view, with the syntax detector's alignment (to: sum, from: mean)."""
    try:
        to_word, from_word = token_word_maps(encoding["offsets"], encoding["special"], spans, len(text))
    except AlignmentError as exc:
        raise InputError(f"--words: {exc}", hint="check the word separators") from exc
    words = word_attention(view.weights[None], to_word[None], from_word[None])[0]
    labels = [text[s:e] for s, e in spans]
    return AttentionView(view.layer, view.heads, words, labels, "word")


def check_request(text: str, head: str, words: bool, word_sep: str | None) -> tuple[str, list | None]:
    """``show``'s cheap checks, before a model loads. Returns the text (word marks removed) and its
    word spans (None for token-level attention)."""
    if word_sep is not None and not words:
        raise InputError("--word-sep needs --words")
    check_text(text)
    parse_heads(head, None)  # the syntax now, the range once the model is known
    if not words:
        return text, None
    if word_sep is not None:
        return split_marked(text, word_sep)
    return text, word_spans(text)


def show_attention(
    loaded: LoadedModel, text: str, layer: int, head: str, *, words: bool = False, word_sep: str | None = None
) -> AttentionView:
    """One layer's attention on ``text`` for the heads ``head`` names (a number, a list, or all)."""
    text, spans = check_request(text, head, words, word_sep)
    heads = parse_heads(head, loaded.layout.n_heads)
    view, encoding = attention_view(loaded, text, layer, heads)
    if spans is not None:
        view = to_words(view, text, encoding, spans)
    return view
