"""The texts a description is fitted on and evaluated on, cut into token windows.

Shipped texts, in English and Chinese: the natural-text set (``configs/text/natural.yaml``), the
haystacks (``configs/retrieval/haystack-*.txt``) and the treebanks (``configs/syntax/*.conllu``,
whose parses feed the ``dep-*`` templates). Each source is split in two by position: its first
half is the **fit** split, its second half the **evaluation** split, so a description is never
scored on a text it was fitted on. Within a split, a source's units (texts, paragraphs, sentences)
are joined (paragraphs by a blank line, English sentences by a space, Chinese ones by nothing) and
cut into ``context``-token windows, BOS first (CLS ... SEP for encoders).

A user's evaluation text (``eval_text``) is read like ``icl --text``: paragraphs separated by blank
lines, each cut into windows on its own; a user's treebank (``eval_treebank``) is joined like the
shipped ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.data.conllu import read_conllu
from headscope.data.prompts import _read_text, configs_dir, display_path, load_texts, split_paragraphs
from headscope.errors import InputError, PromptSetError
from headscope.extend.protocol import split_names

from .templates import Text, make_text, words_of

LANGS = ("en", "zh")


def check_langs(value: str) -> list[str]:
    """``--lang``'s languages (comma list), each one of :data:`LANGS`; refuses an empty or unknown one."""
    names = split_names(value) or []
    if not names or any(n not in LANGS for n in names):
        raise InputError(f"--lang {value}: choose from {', '.join(LANGS)} (comma list)")
    return names


@dataclass
class Source:
    """One joined text of a split: its characters, and (parsed text) its words and their heads."""

    name: str
    lang: str
    text: str
    spans: list[tuple[int, int]] | None = None
    heads: list[int] | None = None


def _halves(units: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    cut = (len(units) + 1) // 2
    return list(units[:cut]), list(units[cut:])


def _joined(name: str, lang: str, units: Sequence[str], sep: str) -> Source:
    return Source(name, lang, sep.join(u.strip() for u in units))


def _treebank_source(name: str, lang: str, sentences: Sequence[Any]) -> Source:
    sep = " " if lang != "zh" else ""
    text, spans, heads = "", [], []
    for sentence in sentences:
        if text:
            text += sep
        base, word_base = len(text), len(spans)
        text += sentence.text
        for word in sentence.words:
            spans.append((base + word.start, base + word.end))
            heads.append(word_base + word.head if word.head >= 0 else -1)
    return Source(name, lang, text, spans, heads)


def shipped_sources(split: str, langs: Sequence[str] = LANGS) -> list[Source]:
    """The shipped texts of ``split`` ("fit" or "eval") in ``langs``."""
    index = 0 if split == "fit" else 1
    root = configs_dir()
    natural = load_texts(root / "text" / "natural.yaml")
    out = []
    for lang in langs:
        items = [item.text for item in natural.items if item.lang == lang]
        if items:
            out.append(
                _joined(f"configs/text/natural.yaml[{lang}, {split}]", lang, _halves(items)[index], "\n\n")
            )
        haystack = root / "retrieval" / f"haystack-{lang}.txt"
        if haystack.exists():
            paragraphs = paragraphs_of(haystack)
            out.append(
                _joined(f"{display_path(haystack)}[{split}]", lang, _halves(paragraphs)[index], "\n\n")
            )
        treebank = root / "syntax" / f"{lang}.conllu"
        if treebank.exists():
            sentences = read_conllu(treebank).sentences
            out.append(
                _treebank_source(f"{display_path(treebank)}[{split}]", lang, _halves(sentences)[index])
            )
    return out


def paragraphs_of(path: str | Path) -> list[str]:
    """A text file's paragraphs (separated by blank lines), with errors that name the file."""
    path = Path(path)
    try:
        raw = _read_text(path)
    except PromptSetError as exc:
        raise InputError(
            exc.message, hint="give a UTF-8 text file: paragraphs separated by blank lines"
        ) from None
    paragraphs = split_paragraphs(raw)
    if not paragraphs:
        raise InputError(f"{path}: no text", hint="paragraphs separated by blank lines")
    return paragraphs


def looks_like_conllu(path: str | Path, paragraphs: Sequence[str]) -> bool:
    """A CoNLL-U file (by its name, or by its first lines: ten tab-separated fields, the first a
    word index), which read as plain text would be its markup, not its sentences."""
    if Path(path).suffix.lower() in (".conllu", ".conll"):
        return True
    lines = [
        line for p in paragraphs[:3] for line in p.splitlines() if line.strip() and not line.startswith("#")
    ][:20]
    rows = [line.split("\t") for line in lines]
    return bool(rows) and all(len(r) == 10 and r[0].split("-")[0].split(".")[0].isdigit() for r in rows)


def user_text_sources(path: str | Path) -> list[Source]:
    paragraphs = paragraphs_of(path)
    if looks_like_conllu(path, paragraphs):
        raise InputError(
            f"--eval-text {display_path(path)}: a CoNLL-U treebank, which would be evaluated as its "
            "markup (tabs, indices, tags), not its sentences",
            hint=f"give it as --eval-treebank {display_path(path)}",
        )
    return [Source(f"{display_path(path)}#{i + 1}", "", p) for i, p in enumerate(paragraphs)]


def user_treebank_sources(path: str | Path) -> list[Source]:
    path = Path(path)
    try:
        treebank = read_conllu(path)
    except PromptSetError as exc:
        raise InputError(exc.message, hint="give a CoNLL-U file (--eval-treebank)") from None
    return [_treebank_source(display_path(path), "", treebank.sentences)]


def _specials(loaded: Any) -> tuple[list[int], list[int]]:
    tokenizer = loaded.tokenizer
    if loaded.is_causal:
        bos = tokenizer.bos_token_id
        return ([int(bos)] if bos is not None else []), []
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    return ([int(cls)] if cls is not None else []), ([int(sep)] if sep is not None else [])


def windows(
    loaded: Any, sources: Sequence[Source], context: int, max_windows: int | None = None
) -> list[Text]:
    """Each source cut into windows of ``context`` tokens (plus BOS, or CLS and SEP). A window
    shorter than 8 tokens (a source's tail) is left out unless it is the source's only one."""
    prefix, suffix = _specials(loaded)
    tokenizer = loaded.tokenizer
    vocab = len(tokenizer)
    out: list[Text] = []
    for source in sources:
        if not source.text.strip():
            continue
        # The whole source at once (cut into windows below): no warning about the model's length.
        enc = tokenizer(source.text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids = list(enc["input_ids"])
        offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
        spans = source.spans if source.spans is not None else words_of(source.text)
        starts = list(range(0, len(ids), context))
        for n, start in enumerate(starts):
            piece = ids[start : start + context]
            if len(piece) < 8 and len(starts) > 1:
                continue
            window_ids = prefix + piece + suffix
            special = [True] * len(prefix) + [False] * len(piece) + [True] * len(suffix)
            window_offsets = (
                [(0, 0)] * len(prefix) + offsets[start : start + context] + [(0, 0)] * len(suffix)
            )
            out.append(
                make_text(
                    f"{source.name}#{n + 1}" if len(starts) > 1 else source.name,
                    window_ids,
                    special,
                    window_offsets,
                    source.text,
                    spans=spans,
                    heads=source.heads,
                    causal=loaded.is_causal,
                    vocab_size=vocab,
                    lang=source.lang,
                )
            )
            if max_windows is not None and len(out) >= max_windows:
                return out
    return out


def balanced(texts: list[Text], limit: int | None) -> list[Text]:
    """At most ``limit`` windows, taken in turn from each source so that every language and
    source is represented (None: all)."""
    if limit is None or len(texts) <= limit:
        return texts
    by_source: dict[str, list[Text]] = {}
    for text in texts:
        by_source.setdefault(text.name.split("#")[0], []).append(text)
    queues = list(by_source.values())
    out: list[Text] = []
    while len(out) < limit:
        for queue in queues:
            if queue and len(out) < limit:
                out.append(queue.pop(0))
    return out
