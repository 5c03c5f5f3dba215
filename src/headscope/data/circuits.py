"""Data for circuit analyses: indirect-object identification (IOI) sets and needle-in-a-haystack sets.

Formats follow :mod:`headscope.data.prompts` (YAML with ``name``, ``description`` and ``items``, or
JSONL with one item per line), and errors name file, line and item id.

* IOI items: ``text`` (the prompt up to the indirect object, e.g. "When Mary and John went to the
  store, John gave a drink to"), ``io`` (the indirect object, "Mary") and ``s`` (the subject,
  "John"), optional ``id``, ``lang`` and ``template``. ``io`` must occur in the text, ``s`` at least
  twice.
* Retrieval items: ``needle`` (a sentence hidden in filler text), ``question`` and ``answer`` (a
  substring of the needle that does not start it), optional ``id`` and ``lang``.
* Haystacks: filler text, ``.txt`` (split into sentences) or ``.conllu`` (its ``# text`` lines).

No torch and no tokenizer here: token positions are the analyses' business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.data.prompts import (
    _check_unique,
    _item_fields,
    _raw_items,
    _read_text,
    describe_value,
    id_as_written,
    split_lines,
)
from headscope.errors import PromptSetError, elide

IOI_ITEM_KEYS = {"id", "lang", "template", "text", "io", "s"}
NEEDLE_ITEM_KEYS = {"id", "lang", "needle", "question", "answer"}
MIN_HAYSTACK_SENTENCES = 5

# Scripts written without spaces between words: a name there is found as a plain substring.
_UNSPACED = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\u0e00-\u0e7f"
)
_UNSPACED_CHAR = re.compile(f"[{_UNSPACED}]")
# A word character of a spaced script: what must not touch a Latin-script name on either side
# ("Ann" is not in "Anna"; "Mary" is in "Mary和John").
_WORD = f"[^\\W{_UNSPACED}]"

# Sentence ends: . ! ? (optionally followed by a closing quote or bracket) then whitespace;
# Chinese 。！？ (with any closing quote kept on the same sentence) then optional whitespace.
_SENTENCE_END = re.compile(
    r"(?<=[.!?])\s+"
    r"|(?<=[.!?][\"'”’)\]])\s+"
    r"|(?<=[。！？])(?![”’」』）)\]])\s*"
    r"|(?<=[。！？][”’」』）)\]])\s*"
)
_CONLLU_TEXT = re.compile(r"^#\s*text\s*=\s*(.*?)\s*$")


def occurrences(text: str, name: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of ``name`` in ``text``, left to right, non-overlapping.

    Names in spaced scripts (Latin, Cyrillic, ...) match whole words only, so "Ann" is not found in
    "Anna"; names containing CJK, kana, Hangul or Thai characters match as plain substrings.
    """
    if not name:
        return []
    if _UNSPACED_CHAR.search(name):
        spans, start = [], text.find(name)
        while start >= 0:
            spans.append((start, start + len(name)))
            start = text.find(name, start + len(name))
        return spans
    pattern = re.compile(f"(?<!{_WORD}){re.escape(name)}(?!{_WORD})")
    return [m.span() for m in pattern.finditer(text)]


def _item_where(raw: Any, where: str, index: int, stem: str) -> tuple[str, str]:
    """(item id, ``file:line: item 'id'``) for messages; the default id is ``stem-N``."""
    shown = (
        id_as_written(raw.get("id", f"{stem}-{index + 1}"))
        if isinstance(raw, dict)
        else f"{stem}-{index + 1}"
    )
    return shown, f"{where}: item '{elide(shown)}'"


def _shown(value: Any) -> str:
    return describe_value(value)


def _string(raw: dict[str, Any], key: str, where: str) -> str:
    if key not in raw:
        raise PromptSetError(f"{where}: missing '{key}'")
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        raise PromptSetError(f"{where}: '{key}' must be a non-empty string, got {_shown(value)}")
    return value


def _optional_string(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise PromptSetError(f"{where}: '{key}' must be a string, got {_shown(value)}")
    return value


# --- IOI -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IOIItem:
    id: str
    text: str
    io: str
    s: str
    lang: str | None = None
    template: str | None = None
    source: str = ""  # "file:line", for error messages


@dataclass
class IOISet:
    name: str
    items: list[IOIItem]
    path: str
    description: str = ""


def _ioi_item(raw: Any, where: str, index: int, stem: str) -> IOIItem:
    item_id, at = _item_where(raw, where, index, stem)
    raw = _item_fields(raw, at if isinstance(raw, dict) else where, index, IOI_ITEM_KEYS, "a mapping")
    text = _string(raw, "text", at)
    io = _string(raw, "io", at)
    s = _string(raw, "s", at)
    if text != text.rstrip():
        raise PromptSetError(
            f"{at}: 'text' must not end with whitespace (the next token carries its own space)"
        )
    if io.strip() != io or s.strip() != s:
        raise PromptSetError(f"{at}: 'io' and 's' must not start or end with whitespace")
    if io == s:
        raise PromptSetError(f"{at}: 'io' and 's' are the same name (\"{elide(io)}\"); they must differ")
    if not occurrences(text, io):
        raise PromptSetError(f"{at}: 'io' (\"{elide(io)}\") does not occur in 'text'")
    if len(occurrences(text, s)) < 2:
        found = len(occurrences(text, s))
        raise PromptSetError(f"{at}: 's' (\"{elide(s)}\") must occur at least twice in 'text', found {found}")
    lang = _optional_string(raw, "lang", at)
    template = _optional_string(raw, "template", at)
    return IOIItem(item_id, text, io, s, lang, template, where)


def load_ioi(path: str | Path) -> IOISet:
    """Load an IOI set (YAML or JSONL)."""
    path = Path(path)
    raw_items, header = _raw_items(path, _read_text(path))
    items = [_ioi_item(raw, where, i, path.stem) for i, (where, raw) in enumerate(raw_items)]
    _check_unique(items)  # type: ignore[arg-type]
    return IOISet(
        str(header.get("name", path.stem)), items, str(path), str(header.get("description", "")).strip()
    )


# --- needle in a haystack ------------------------------------------------------------------------


@dataclass(frozen=True)
class NeedleItem:
    id: str
    needle: str
    question: str
    answer: str
    lang: str | None = None
    source: str = ""  # "file:line", for error messages

    @property
    def answer_span(self) -> tuple[int, int]:
        """Character span ``[start, end)`` of the answer's first occurrence in the needle."""
        start = self.needle.index(self.answer)
        return (start, start + len(self.answer))

    @property
    def answer_prefix(self) -> str:
        """The needle up to the answer, e.g. "The secret code of the blue lighthouse is "."""
        return self.needle[: self.answer_span[0]]


@dataclass
class RetrievalSet:
    name: str
    items: list[NeedleItem]
    path: str
    description: str = ""


def _needle_item(raw: Any, where: str, index: int, stem: str) -> NeedleItem:
    item_id, at = _item_where(raw, where, index, stem)
    raw = _item_fields(raw, at if isinstance(raw, dict) else where, index, NEEDLE_ITEM_KEYS, "a mapping")
    needle = _string(raw, "needle", at)
    question = _string(raw, "question", at)
    answer = _string(raw, "answer", at)
    start = needle.find(answer)
    if start < 0:
        raise PromptSetError(f"{at}: 'answer' ({elide(repr(answer))}) does not occur in 'needle'")
    if start == 0:
        raise PromptSetError(
            f"{at}: 'answer' ({elide(repr(answer))}) starts the needle; the needle must lead up to it "
            "(e.g. 'The code of the door is 123456.')"
        )
    if answer in question:
        raise PromptSetError(
            f"{at}: 'answer' ({elide(repr(answer))}) occurs in 'question', which gives it away"
        )
    lang = _optional_string(raw, "lang", at)
    return NeedleItem(item_id, needle, question, answer, lang, where)


def load_retrieval(path: str | Path) -> RetrievalSet:
    """Load a needle set (YAML or JSONL)."""
    path = Path(path)
    raw_items, header = _raw_items(path, _read_text(path))
    items = [_needle_item(raw, where, i, path.stem) for i, (where, raw) in enumerate(raw_items)]
    _check_unique(items)  # type: ignore[arg-type]
    return RetrievalSet(
        str(header.get("name", path.stem)), items, str(path), str(header.get("description", "")).strip()
    )


def split_sentences(text: str) -> list[str]:
    """Sentences of plain text: after . ! ? and whitespace, or after Chinese 。！？; empties dropped."""
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def load_haystack(path: str | Path) -> list[str]:
    """Filler sentences, in order: a ``.txt`` file split into sentences, or a ``.conllu`` file's ``# text``."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in {".txt", ".conllu"}:
        raise PromptSetError(f"{path}: unknown haystack format '{path.suffix}'; use .txt or .conllu")
    text = _read_text(path)
    if suffix == ".txt":
        sentences = split_sentences(text)
    else:
        sentences = [
            m.group(1) for line in split_lines(text) if (m := _CONLLU_TEXT.match(line)) and m.group(1)
        ]
    if len(sentences) < MIN_HAYSTACK_SENTENCES:
        raise PromptSetError(
            f"{path}: {len(sentences)} sentence(s), too short to hide a needle in "
            f"(at least {MIN_HAYSTACK_SENTENCES} needed)"
        )
    return sentences
