"""A strict, small CoNLL-U reader for Universal Dependencies treebanks.

* empty nodes (``8.1``) are skipped; multiword-token ranges (``1-2 del``) are not words, but their
  FORM is the surface text that their words were split from;
* relation subtypes are folded (``nsubj:pass`` counts as ``nsubj``);
* every word gets an exact character span in ``Sentence.text``, the text the model reads.

The text and the spans come from the surface tokens: a range line's FORM for the words inside a
multiword token, the word's own FORM otherwise. When the sentence has a ``# text`` line, that is the
text, and the surface tokens are walked through it in order, skipping only whitespace; a surface
token that is not found where the walk expects it is an error (the comment and the forms
disagree), so a span can never point at the wrong characters. Without ``# text`` the text is
rebuilt from the surface tokens and ``SpaceAfter=No``.

Words of one multiword token share characters: Spanish "del" is the words "de" + "el". When the
word forms concatenate exactly to the surface form (English "don't" = "do" + "n't"), each word
keeps its own part of it; otherwise (the usual case outside English) every word of the range
gets the range's whole span, and alignment treats them as sharing the range's tokens.

Errors name the file and line. With ``skip_bad=True`` a malformed sentence is skipped and counted
instead; nothing is ever scored from a partly read sentence.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from headscope.errors import PromptSetError


class TreebankError(PromptSetError):
    """A malformed CoNLL-U file. The message names file and line."""


@dataclass(frozen=True)
class Word:
    index: int  # 0-based position in the sentence
    form: str
    start: int  # character span in Sentence.text, [start, end); shared inside a multiword token
    end: int
    head: int  # 0-based index of the head word, -1 for the root
    deprel: str  # base relation, subtype folded
    full_deprel: str


@dataclass
class Sentence:
    id: str
    text: str
    words: list[Word]
    source: str  # "file:line" of the first line of the sentence

    def arcs(self, relations: set[str] | None = None) -> list[tuple[int, int, str]]:
        """(dependent, head, relation) for every non-root word, optionally filtered by relation."""
        return [
            (w.index, w.head, w.deprel)
            for w in self.words
            if w.head >= 0 and (relations is None or w.deprel in relations)
        ]


@dataclass
class Treebank:
    path: str
    sentences: list[Sentence]
    skipped: list[str] = field(default_factory=list)  # "file:line: reason" per skipped sentence

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class _Surface:
    """One token of the surface text: a multiword range, or a word outside every range."""

    lineno: int
    form: str
    first: int  # 0-based positions of its words, first..last inclusive
    last: int
    space_after: bool


def _blocks(lines: list[str]) -> Iterator[tuple[int, list[tuple[int, str]]]]:
    """Yield (first line number, [(line number, line)]) per blank-line separated block."""
    block: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            block.append((lineno, line))
        elif block:
            yield block[0][0], block
            block = []
    if block:
        yield block[0][0], block


def _space_after(misc: str) -> bool:
    return "SpaceAfter=No" not in misc.split("|")


def _surface_tokens(
    path: Path, rows: list[tuple[int, list[str]]], ranges: list[tuple[int, int, int, list[str]]]
) -> list[_Surface]:
    """The surface tokens in order; every word belongs to exactly one."""
    n_words = len(rows)
    by_first = {}
    for lineno, first, last, cols in ranges:
        if not 1 <= first < last <= n_words:
            raise TreebankError(
                f"{path}:{lineno}: multiword range {first}-{last} does not cover words of the sentence "
                f"(it has {n_words} words)"
            )
        if not cols[1]:
            raise TreebankError(f"{path}:{lineno}: empty FORM")
        if first in by_first:
            raise TreebankError(f"{path}:{lineno}: two multiword ranges start at word {first}")
        by_first[first] = _Surface(lineno, cols[1], first - 1, last - 1, _space_after(cols[9]))
    tokens: list[_Surface] = []
    position = 0
    while position < n_words:
        surface = by_first.pop(position + 1, None)
        if surface is None:
            lineno, cols = rows[position]
            surface = _Surface(lineno, cols[1], position, position, _space_after(cols[9]))
        tokens.append(surface)
        position = surface.last + 1
    if by_first:  # a range that starts inside another one
        lineno = min(s.lineno for s in by_first.values())
        raise TreebankError(f"{path}:{lineno}: multiword range overlaps another range")
    return tokens


def _surface_spans(
    path: Path, tokens: list[_Surface], text: str | None, text_line: int
) -> tuple[str, list[tuple[int, int]]]:
    """The sentence text and each surface token's span in it (see the module docstring)."""
    spans: list[tuple[int, int]] = []
    if text is None:
        parts: list[str] = []
        offset = 0
        for i, token in enumerate(tokens):
            spans.append((offset, offset + len(token.form)))
            parts.append(token.form)
            offset += len(token.form)
            if token.space_after and i < len(tokens) - 1:
                parts.append(" ")
                offset += 1
        return "".join(parts), spans
    position = 0
    for token in tokens:
        while position < len(text) and text[position].isspace():
            position += 1
        if not text.startswith(token.form, position):
            found = text[position : position + len(token.form) + 5]
            raise TreebankError(
                f"{path}:{token.lineno}: FORM '{token.form}' disagrees with '# text' (line {text_line}): "
                f"at character {position} the text has '{found}'",
                hint="the forms of a multiword token's range line (1-2) must spell the text",
            )
        spans.append((position, position + len(token.form)))
        position += len(token.form)
    rest = text[position:]
    if rest.strip():
        raise TreebankError(
            f"{path}:{text_line}: '# text' continues with '{rest.strip()[:20]}' after the last FORM"
        )
    return text, spans


def _parse_sentence(path: Path, first_line: int, block: list[tuple[int, str]]) -> Sentence | None:
    sent_id = ""
    text: str | None = None
    text_line = 0
    rows: list[tuple[int, list[str]]] = []
    ranges: list[tuple[int, int, int, list[str]]] = []  # (line, first id, last id, columns)
    for lineno, line in block:
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id":
                sent_id = value.strip()
            elif key.strip() == "text":
                text, text_line = value.strip(), lineno
            continue
        cols = line.rstrip("\n").split("\t")
        if len(cols) != 10:
            raise TreebankError(
                f"{path}:{lineno}: expected 10 tab-separated columns, found {len(cols)}",
                hint="CoNLL-U columns are ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC",
            )
        token_id = cols[0]
        if "." in token_id:
            continue  # empty node of an enhanced graph
        if "-" in token_id:
            start_s, _, end_s = token_id.partition("-")
            if not (start_s.isascii() and start_s.isdigit() and end_s.isascii() and end_s.isdigit()):
                raise TreebankError(f"{path}:{lineno}: malformed multiword range '{token_id}'")
            ranges.append((lineno, int(start_s), int(end_s), cols))
            continue
        if not (token_id.isascii() and token_id.isdigit()):
            raise TreebankError(f"{path}:{lineno}: ID '{token_id}' is not a word number")
        rows.append((lineno, cols))
    if not rows:
        return None
    n_words = len(rows)
    for position, (lineno, cols) in enumerate(rows):
        token_id = int(cols[0])
        if token_id != position + 1:
            raise TreebankError(f"{path}:{lineno}: word IDs must run 1, 2, 3, …; found {token_id}")
        if not cols[1]:
            raise TreebankError(f"{path}:{lineno}: empty FORM")
    tokens = _surface_tokens(path, rows, ranges)
    text, surface_spans = _surface_spans(path, tokens, text, text_line)
    spans: list[tuple[int, int]] = []
    for token, (start, end) in zip(tokens, surface_spans, strict=True):
        forms = [rows[i][1][1] for i in range(token.first, token.last + 1)]
        if "".join(forms) == token.form:  # "don't" = "do" + "n't": each word keeps its part
            for form in forms:
                spans.append((start, start + len(form)))
                start += len(form)
        else:  # "del" = "de" + "el": the words share the range's characters
            spans.extend([(start, end)] * len(forms))
    words: list[Word] = []
    for position, ((lineno, cols), (start, end)) in enumerate(zip(rows, spans, strict=True)):
        head_s = cols[6]
        if not (head_s.isascii() and head_s.lstrip("-").isdigit()):
            raise TreebankError(f"{path}:{lineno}: HEAD '{head_s}' is not a number")
        head = int(head_s)
        if head < 0 or head > n_words:
            raise TreebankError(
                f"{path}:{lineno}: HEAD {head} points outside the sentence (it has {n_words} words)"
            )
        if head == position + 1:
            raise TreebankError(f"{path}:{lineno}: word {head} is its own HEAD")
        full = cols[7]
        if not full or full == "_":
            raise TreebankError(f"{path}:{lineno}: DEPREL is empty")
        words.append(Word(position, cols[1], start, end, head - 1, full.split(":")[0], full))
    return Sentence(sent_id or f"{path.stem}-{first_line}", text, words, f"{path}:{first_line}")


def read_conllu(path: str | Path, *, skip_bad: bool = False, limit: int | None = None) -> Treebank:
    """Read a CoNLL-U file. Raises TreebankError on the first problem unless ``skip_bad``."""
    from headscope.data.prompts import _read_text, split_lines

    path = Path(path)
    text = _read_text(path)  # missing, directory, binary, encoding and empty-file errors
    treebank = Treebank(str(path), [])
    for first_line, block in _blocks(split_lines(text)):
        try:
            sentence = _parse_sentence(path, first_line, block)
        except TreebankError as exc:
            if not skip_bad:
                raise
            treebank.skipped.append(str(exc))
            continue
        if sentence is not None:
            treebank.sentences.append(sentence)
        if limit is not None and len(treebank.sentences) >= limit:
            break
    if not treebank.sentences:
        raise TreebankError(f"{path}: no sentences with word lines found", hint="is this a CoNLL-U file?")
    return treebank
