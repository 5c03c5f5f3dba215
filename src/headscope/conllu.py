"""A strict, small CoNLL-U reader for Universal Dependencies treebanks.

* multiword-token ranges (``1-2``) and empty nodes (``8.1``) are skipped as words; a range's
  ``SpaceAfter=No`` still governs the spacing after its last word;
* relation subtypes are folded (``nsubj:pass`` counts as ``nsubj``);
* the sentence text is rebuilt from the word forms and ``SpaceAfter=No``, so every word has an
  exact character span in the text the model reads.

Errors name the file and line. With ``skip_bad=True`` a malformed sentence is skipped and counted
instead; nothing is ever scored from a partly read sentence.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PromptSetError


class TreebankError(PromptSetError):
    """A malformed CoNLL-U file. The message names file and line."""


@dataclass(frozen=True)
class Word:
    index: int  # 0-based position in the sentence
    form: str
    start: int  # character span in Sentence.text, [start, end)
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


def _parse_sentence(path: Path, first_line: int, block: list[tuple[int, str]]) -> Sentence | None:
    sent_id = ""
    rows: list[tuple[int, list[str]]] = []
    ranges: dict[int, tuple[int, bool]] = {}  # last word id of a range -> (first id, space after)
    for lineno, line in block:
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id":
                sent_id = value.strip()
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
            if not (start_s.isdigit() and end_s.isdigit()):
                raise TreebankError(f"{path}:{lineno}: malformed multiword range '{token_id}'")
            ranges[int(end_s)] = (int(start_s), "SpaceAfter=No" not in cols[9].split("|"))
            continue
        if not token_id.isdigit():
            raise TreebankError(f"{path}:{lineno}: ID '{token_id}' is not a word number")
        rows.append((lineno, cols))
    if not rows:
        return None
    n_words = len(rows)
    in_range = {i for end, (start, _) in ranges.items() for i in range(start, end)}
    text_parts: list[str] = []
    offset = 0
    words: list[Word] = []
    for position, (lineno, cols) in enumerate(rows):
        token_id = int(cols[0])
        if token_id != position + 1:
            raise TreebankError(f"{path}:{lineno}: word IDs must run 1, 2, 3, …; found {token_id}")
        form = cols[1]
        if not form:
            raise TreebankError(f"{path}:{lineno}: empty FORM")
        head_s = cols[6]
        if not head_s.lstrip("-").isdigit():
            raise TreebankError(f"{path}:{lineno}: HEAD '{head_s}' is not a number")
        head = int(head_s)
        if head < 0 or head > n_words:
            raise TreebankError(
                f"{path}:{lineno}: HEAD {head} points outside the sentence (it has {n_words} words)"
            )
        if head == token_id:
            raise TreebankError(f"{path}:{lineno}: word {token_id} is its own HEAD")
        full = cols[7]
        if not full or full == "_":
            raise TreebankError(f"{path}:{lineno}: DEPREL is empty")
        words.append(Word(position, form, offset, offset + len(form), head - 1, full.split(":")[0], full))
        text_parts.append(form)
        offset += len(form)
        if token_id in ranges:
            space = ranges[token_id][1]
        elif token_id in in_range:
            space = False
        else:
            space = "SpaceAfter=No" not in cols[9].split("|")
        if space and position < n_words - 1:
            text_parts.append(" ")
            offset += 1
    text = "".join(text_parts)
    return Sentence(sent_id or f"{path.stem}-{first_line}", text, words, f"{path}:{first_line}")


def read_conllu(path: str | Path, *, skip_bad: bool = False, limit: int | None = None) -> Treebank:
    """Read a CoNLL-U file. Raises TreebankError on the first problem unless ``skip_bad``."""
    from .prompts import _read_text

    path = Path(path)
    text = _read_text(path)  # missing, directory, binary, encoding and empty-file errors
    treebank = Treebank(str(path), [])
    for first_line, block in _blocks(text.splitlines()):
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
