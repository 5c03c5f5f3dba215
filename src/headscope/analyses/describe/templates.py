"""The template library: named attention patterns that a head's attention is described by.

A template is a function of the tokens, words and parse of one text window, never of the model's
activations. At each query ``q`` it names target keys (with weights, normally equal); where it
names none, it says nothing at ``q``. Over the keys the layer's mask leaves visible, its weights
are normalised to sum to 1, so a template is a distribution ``P_t[q, ·]`` or nothing.

Each template is one :class:`Template` declaration in :data:`TEMPLATES`; plugins add more through
the entry-point group ``headscope.templates`` (a ``Template`` or a list of them), notebooks with
``hs.register(Template(...))``. The names are fixed, so atlases compare across models and versions.

Words: without a parse, a word is a run of letters or digits (a Latin word, a number), one CJK
character, or one punctuation mark; with a treebank, the treebank's words. A token belongs to the
word its first non-space character falls in.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headscope.core.registry import Registry
from headscope.errors import InputError

# Query classes, one per query token (the first that applies, in this order).
QUERY_CLASSES = ("line-start", "punctuation", "digit", "word-continuation", "function-word", "content-word")
# Key classes of the key-class:<c> templates (a token may be in several).
KEY_CLASSES = ("punctuation", "digit", "capitalised", "function-word", "content-word", "rare-token")
# last-delimiter:<label>: labels, not the marks themselves, so that names survive comma lists.
DELIMITERS = {"period": ".", "comma": ",", "semicolon": ";", "newline": "\n", "dunhao": "、", "juhao": "。"}
SENTENCE_ENDS = set(".!?。！？")
BRACKETS = {")": "(", "]": "[", "}": "{", "）": "（", "】": "【", "》": "《", "」": "「", "”": "“", "’": "‘"}
# The kinds a template belongs to (the division-of-labour table); the atlas's schema enumerates them.
KINDS = ("sink", "offset", "diffuse", "token", "structure", "syntax", "key-class", "other")
OFFSETS = tuple(range(1, 9))
LOCAL_WIDTHS = (4, 16)
DECAY_RATES = (0.5, 0.8, 0.95)

# Function words: English closed classes, and Chinese particles, pronouns, prepositions and
# conjunctions of one character or two (a CJK word here is one character, so two-character
# entries never match a word; they are kept for parsed text, whose words can be longer).
FUNCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "this",
        "that",
        "these",
        "those",
        "my",
        "your",
        "his",
        "her",
        "its",
        "our",
        "their",
        "i",
        "you",
        "he",
        "she",
        "it",
        "we",
        "they",
        "me",
        "him",
        "us",
        "them",
        "who",
        "whom",
        "whose",
        "which",
        "what",
        "of",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "to",
        "into",
        "onto",
        "over",
        "under",
        "about",
        "after",
        "before",
        "between",
        "through",
        "during",
        "without",
        "within",
        "and",
        "or",
        "but",
        "nor",
        "so",
        "yet",
        "if",
        "because",
        "while",
        "although",
        "though",
        "as",
        "than",
        "then",
        "when",
        "where",
        "whether",
        "not",
        "no",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "have",
        "has",
        "had",
        "will",
        "would",
        "shall",
        "should",
        "can",
        "could",
        "may",
        "might",
        "must",
        "there",
        "here",
        "all",
        "any",
        "some",
        "each",
        "every",
        "both",
        "either",
        "neither",
        "such",
        "own",
        "very",
        "just",
        "also",
        "only",
        "too",
        "up",
        "out",
        "off",
        "down",
        "again",
        "once",
        "的",
        "了",
        "是",
        "在",
        "和",
        "与",
        "及",
        "也",
        "就",
        "都",
        "而",
        "把",
        "被",
        "对",
        "从",
        "向",
        "于",
        "以",
        "为",
        "之",
        "其",
        "这",
        "那",
        "我",
        "你",
        "他",
        "她",
        "它",
        "们",
        "着",
        "过",
        "吗",
        "呢",
        "吧",
        "啊",
        "个",
        "不",
        "没",
        "很",
        "又",
        "还",
        "让",
        "给",
        "但",
        "或",
        "并",
        "所",
        "地",
        "得",
        "此",
        "该",
        "每",
        "各",
        "某",
        "如",
        "若",
        "因",
        "由",
        "将",
        "已",
        "曾",
        "才",
    ]
)

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


@dataclass
class Text:
    """One window of tokens and what the templates read from it.

    ``pieces[i]`` is the text token i covers ('' for special tokens); ``word[i]`` the index of its
    word (-1 for special tokens); ``heads[w]`` the head word of word w (-1 for the root, None
    without a parse)."""

    name: str
    ids: list[int]
    special: list[bool]
    pieces: list[str]
    word: list[int]
    word_forms: list[str]
    heads: list[int] | None = None
    causal: bool = True
    vocab_size: int = 1
    lang: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    # --- token facts, computed once -------------------------------------------------------------
    def _memo(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def content(self) -> np.ndarray:
        return self._memo("content", lambda: ~np.asarray(self.special, dtype=bool))

    def word_start(self) -> np.ndarray:
        def make() -> np.ndarray:
            out = np.zeros(len(self), dtype=bool)
            previous = -1
            for i, w in enumerate(self.word):
                out[i] = w >= 0 and w != previous
                previous = w if w >= 0 else previous
            return out

        return self._memo("word_start", make)

    def key_classes(self) -> dict[str, np.ndarray]:
        def make() -> dict[str, np.ndarray]:
            n = len(self)
            out = {c: np.zeros(n, dtype=bool) for c in KEY_CLASSES}
            rare_from = self.vocab_size // 2
            for i, piece in enumerate(self.pieces):
                stripped = piece.strip()
                if self.special[i] or not stripped:
                    continue
                if all(_is_punct(ch) for ch in stripped):
                    out["punctuation"][i] = True
                elif stripped.isdigit():
                    out["digit"][i] = True
                else:
                    form = self.word_forms[self.word[i]].lower() if self.word[i] >= 0 else stripped.lower()
                    out["function-word" if form in FUNCTION_WORDS else "content-word"][i] = True
                if stripped[0].isupper():
                    out["capitalised"][i] = True
                if self.ids[i] >= rare_from:
                    out["rare-token"][i] = True
            return out

        return self._memo("key_classes", make)

    def line_start(self) -> np.ndarray:
        """Tokens right after a token that holds a line break (the first token of a line)."""

        def make() -> np.ndarray:
            out = np.zeros(len(self), dtype=bool)
            for i in range(1, len(self)):
                out[i] = "\n" in self.pieces[i - 1] and not self.special[i] and self.pieces[i].strip() != ""
            return out

        return self._memo("line_start", make)

    def query_classes(self) -> np.ndarray:
        """Each token's query class (index into QUERY_CLASSES; -1 for special tokens)."""

        def make() -> np.ndarray:
            keys = self.key_classes()
            starts, lines = self.word_start(), self.line_start()
            out = np.full(len(self), -1, dtype=np.int64)
            for i in range(len(self)):
                if self.special[i]:
                    continue
                if lines[i]:
                    name = "line-start"
                elif keys["punctuation"][i] or not self.pieces[i].strip():
                    name = "punctuation"
                elif keys["digit"][i]:
                    name = "digit"
                elif not starts[i]:
                    name = "word-continuation"
                elif keys["function-word"][i]:
                    name = "function-word"
                else:
                    name = "content-word"
                out[i] = QUERY_CLASSES.index(name)
            return out

        return self._memo("query_classes", make)

    def sentence_starts(self) -> np.ndarray:
        """The first content token of each token's sentence (-1 for special tokens)."""

        def make() -> np.ndarray:
            out = np.full(len(self), -1, dtype=np.int64)
            start, ended = -1, True
            for i, piece in enumerate(self.pieces):
                if self.special[i]:
                    continue
                if ended and piece.strip():
                    start, ended = i, False
                out[i] = start if start >= 0 else i
                stripped = piece.strip()
                if (stripped and stripped[-1] in SENTENCE_ENDS) or "\n" in piece:
                    ended = True
            return out

        return self._memo("sentence_starts", make)


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


# --- building windows -------------------------------------------------------------------------


def words_of(text: str) -> list[tuple[int, int]]:
    """Character spans of the words of ``text`` (see the module's docstring)."""
    return [m.span() for m in WORD.finditer(text)]


def make_text(
    name: str,
    ids: Sequence[int],
    special: Sequence[bool],
    offsets: Sequence[tuple[int, int]],
    text: str,
    *,
    spans: Sequence[tuple[int, int]] | None = None,
    heads: Sequence[int] | None = None,
    causal: bool = True,
    vocab_size: int = 1,
    lang: str = "",
) -> Text:
    """A :class:`Text` from a tokenization with character offsets into ``text``. ``spans`` (the
    words' character spans) defaults to :func:`words_of`; ``heads`` gives each word's head word."""
    spans = list(spans) if spans is not None else words_of(text)
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = np.array([e for _, e in spans], dtype=np.int64)
    pieces, word = [], []
    for (a, b), is_special in zip(offsets, special, strict=True):
        if is_special or b <= a:
            pieces.append("")
            word.append(-1)
            continue
        piece = text[a:b]
        pieces.append(piece)
        lead = a + (len(piece) - len(piece.lstrip()))
        if lead >= b:  # whitespace only: the word it precedes
            lead = a
        at = int(np.searchsorted(starts, lead, side="right")) - 1
        if at >= 0 and ends[at] > lead:
            word.append(at)
        elif at + 1 < len(spans) and starts[at + 1] < b:
            word.append(at + 1)
        else:
            word.append(-1)
    forms = [text[s:e] for s, e in spans]
    return Text(
        name,
        list(ids),
        [bool(s) for s in special],
        pieces,
        word,
        forms,
        list(heads) if heads is not None else None,
        causal,
        vocab_size,
        lang,
    )


# --- templates ----------------------------------------------------------------------------------

# targets(text) -> (queries, keys, weights): int64, int64, float64 arrays. Weights need not sum to
# 1 (they are normalised over the visible keys); keys a causal model cannot see are dropped later.
Targets = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Template:
    """One named attention pattern: ``targets(text)`` gives ``(queries, keys, weights)``.

    ``kind`` groups templates for the division-of-labour table (sink, offset, diffuse, token,
    structure, syntax, key-class); ``family`` is the name an atlas reports (``decay`` for every rate, with
    ``param`` the rate)."""

    name: str
    summary: str
    targets: Callable[[Text], Targets]
    kind: str = "other"  # sink, offset, diffuse, token, structure, syntax, key-class (or other)
    family: str = ""
    param: float | None = None
    encoder_only: bool = False

    @property
    def reported(self) -> str:
        return self.family or self.name


def _pairs(queries: list[int], keys: list[int], weights: list[float] | None = None) -> Targets:
    q = np.asarray(queries, dtype=np.int64)
    k = np.asarray(keys, dtype=np.int64)
    w = np.ones(len(q)) if weights is None else np.asarray(weights, dtype=np.float64)
    return q, k, w


def _queries(text: Text) -> np.ndarray:
    return np.nonzero(text.content)[0]


@dataclass(frozen=True)
class Rule:
    """A template's targets as a rule on positions (local, decay, broad, the key classes):
    ``keep(text, q, k)`` is True where it names key k at query q (arrays that broadcast), and
    ``weight(q, k)`` gives the weights there (1 where None). Called on a text, it lists every pair,
    as any template's ``targets`` does; :meth:`grid` gives the weights at a range of queries
    without listing them. These templates name O(n²) pairs in a window of n tokens while describe
    reads a few query rows of it: listing every pair of every window grew with the window's square,
    faster than the forward pass (:class:`~headscope.analyses.describe.fit.TemplateMaps` draws
    them with :meth:`grid` instead)."""

    keep: Callable[[Text, np.ndarray, np.ndarray], np.ndarray]
    weight: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None

    def grid(self, text: Text, start: int, stop: int, keys: int) -> np.ndarray:
        """``[stop - start, keys]`` float64: the weights at queries ``start..stop-1`` over keys
        ``0..keys-1``; 0 where it names nothing (not a content query, past the window's end, a key
        a causal model cannot see)."""
        n = len(text)
        out = np.zeros((stop - start, keys))
        # A causal model's queries up to stop - 1 see no key from stop on: those columns stay 0.
        seen = min(keys, n, stop) if text.causal else min(keys, n)
        q = np.arange(start, min(stop, n))[:, None]
        k = np.arange(seen)[None, :]
        ok = self.keep(text, q, k) & text.content[q]
        if text.causal:
            ok = ok & (k <= q)
        ok = np.broadcast_to(ok, (len(q), seen))
        out[: len(q), :seen] = ok if self.weight is None else np.where(ok, self.weight(q, k), 0.0)
        return out

    def __call__(self, text: Text) -> Targets:
        """Every pair in ``text``, by query (the order a template's targets are listed in)."""
        grid = self.grid(text, 0, len(text), len(text))
        q, k = np.nonzero(grid)
        return q.astype(np.int64), k.astype(np.int64), grid[q, k]


def sink(text: Text) -> Targets:
    q = _queries(text)
    q = q[q > 0]
    return _pairs(list(q), [0] * len(q))


def last_special(text: Text) -> Targets:
    """The window's last special token ([SEP] in an encoder's window), from every query."""
    specials = [i for i, special in enumerate(text.special) if special and i > 0]
    if not specials:
        return _pairs([], [])
    q = _queries(text)
    return _pairs(list(q), [specials[-1]] * len(q))


def self_(text: Text) -> Targets:
    q = _queries(text)
    return _pairs(list(q), list(q))


def offset(n: int) -> Callable[[Text], Targets]:
    def targets(text: Text) -> Targets:
        q = _queries(text)
        k = q - n
        ok = (k >= 0) & (k < len(text))
        return _pairs(list(q[ok]), list(k[ok]))

    return targets


def local(width: int) -> Rule:
    def keep(text: Text, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        return q - k < width if text.causal else np.abs(q - k) <= width // 2

    return Rule(keep)


def decay(rate: float) -> Rule:
    reach = int(np.ceil(np.log(1e-3) / np.log(rate)))  # weights below 1e-3 of the nearest are dropped

    return Rule(
        lambda text, q, k: np.abs(q - k) <= reach, weight=lambda q, k: rate ** np.abs(q - k).astype(float)
    )


broad = Rule(lambda text, q, k: np.ones_like(q, dtype=bool))


def _earlier_same(text: Text, shift: int) -> Targets:
    """Keys k = j + shift for every earlier j holding the query's token (other j for encoders)."""
    queries, keys = [], []
    seen: dict[int, list[int]] = {}
    order = range(len(text))
    for i in order:
        if text.special[i]:
            continue
        seen.setdefault(text.ids[i], []).append(i)
    for i in order:
        if text.special[i]:
            continue
        for j in seen[text.ids[i]]:
            if j == i or (text.causal and j >= i):
                continue
            k = j + shift
            if k == i or not 0 <= k < len(text) or (text.causal and k > i):
                continue
            queries.append(i)
            keys.append(k)
    return _pairs(queries, keys)


def same_token(text: Text) -> Targets:
    return _earlier_same(text, 0)


def induction(text: Text) -> Targets:
    return _earlier_same(text, 1)


def same_word(text: Text) -> Targets:
    """Earlier pieces of the query's own word."""
    queries, keys = [], []
    for i, w in enumerate(text.word):
        if w < 0:
            continue
        for k in range(i - 1, -1, -1):
            if text.word[k] != w:
                break
            queries.append(i)
            keys.append(k)
    return _pairs(queries, keys)


def previous_word(text: Text) -> Targets:
    """Every piece of the word before the query's word."""
    pieces: dict[int, list[int]] = {}
    for i, w in enumerate(text.word):
        if w >= 0:
            pieces.setdefault(w, []).append(i)
    queries, keys = [], []
    for i, w in enumerate(text.word):
        if w <= 0 or (w - 1) not in pieces:
            continue
        for k in pieces[w - 1]:
            if k < i or not text.causal:
                queries.append(i)
                keys.append(k)
    return _pairs(queries, keys)


def sentence_start(text: Text) -> Targets:
    starts = text.sentence_starts()
    q = _queries(text)
    return _pairs(list(q), list(starts[q]))


def line_start(text: Text) -> Targets:
    """The first token of the query's line, where an earlier line break makes one."""
    lines = text.line_start()
    queries, keys, current = [], [], -1
    for i in range(len(text)):
        if lines[i]:
            current = i
        if current >= 0 and not text.special[i]:
            queries.append(i)
            keys.append(current)
    return _pairs(queries, keys)


def last_delimiter(mark: str) -> Callable[[Text], Targets]:
    def targets(text: Text) -> Targets:
        queries, keys, last = [], [], -1
        for i, piece in enumerate(text.pieces):
            if last >= 0 and not text.special[i]:
                queries.append(i)
                keys.append(last)
            if mark in piece:
                last = i
        return _pairs(queries, keys)

    return targets


def bracket_open(text: Text) -> Targets:
    """From a token that closes a bracket to the token that opened it."""
    openers = set(BRACKETS.values())
    stack: list[tuple[str, int]] = []
    queries, keys = [], []
    for i, piece in enumerate(text.pieces):
        for ch in piece:
            if ch in BRACKETS:
                for depth in range(len(stack) - 1, -1, -1):
                    if stack[depth][0] == BRACKETS[ch]:
                        if stack[depth][1] != i:
                            queries.append(i)
                            keys.append(stack[depth][1])
                        del stack[depth:]
                        break
            elif ch in openers:
                stack.append((ch, i))
    return _pairs(queries, keys)


def _word_tokens(text: Text) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, w in enumerate(text.word):
        if w >= 0:
            out.setdefault(w, []).append(i)
    return out


def dep_head(text: Text) -> Targets:
    """Every token of the head word of the query's word (parsed text only)."""
    if text.heads is None:
        return _pairs([], [])
    tokens = _word_tokens(text)
    queries, keys = [], []
    for i, w in enumerate(text.word):
        if w < 0 or w >= len(text.heads) or text.heads[w] < 0:
            continue
        for k in tokens.get(text.heads[w], []):
            if k != i:
                queries.append(i)
                keys.append(k)
    return _pairs(queries, keys)


def dep_child(text: Text) -> Targets:
    """Every token of the words whose head is the query's word (parsed text only)."""
    if text.heads is None:
        return _pairs([], [])
    tokens = _word_tokens(text)
    children: dict[int, list[int]] = {}
    for w, h in enumerate(text.heads):
        if h >= 0:
            children.setdefault(h, []).append(w)
    queries, keys = [], []
    for i, w in enumerate(text.word):
        for child in children.get(w, []) if w >= 0 else []:
            for k in tokens.get(child, []):
                if k != i:
                    queries.append(i)
                    keys.append(k)
    return _pairs(queries, keys)


def key_class(name: str) -> Rule:
    def keep(text: Text, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        return text.key_classes()[name][k] & (k < q if text.causal else k != q)

    return Rule(keep)


def _builtins() -> list[Template]:
    out = [
        Template("sink", "the first token (key 0: BOS or CLS where the tokenizer adds one)", sink, "sink"),
        Template("self", "the query's own token", self_, "offset"),
        Template(
            "sep",
            "the window's last special token ([SEP] after an encoder's text)",
            last_special,
            "sink",
            encoder_only=True,
        ),
    ]
    out += [Template(f"offset-{n}", f"the token {n} before the query", offset(n), "offset") for n in OFFSETS]
    out += [
        Template(f"offset+{n}", f"the token {n} after the query", offset(-n), "offset", encoder_only=True)
        for n in OFFSETS
    ]
    out += [
        Template(f"local-{w}", f"uniform over the last {w} keys (self included)", local(w), "diffuse")
        for w in LOCAL_WIDTHS
    ]
    out += [
        Template(
            f"decay-{rate:g}",
            f"geometric in distance, rate {rate:g} per token",
            decay(rate),
            "diffuse",
            family="decay",
            param=rate,
        )
        for rate in DECAY_RATES
    ]
    out += [
        Template("broad", "uniform over every visible key", broad, "diffuse"),
        Template("same-token", "earlier occurrences of the query's token", same_token, "token"),
        Template(
            "induction", "the token after each earlier occurrence of the query's token", induction, "token"
        ),
        Template("same-word", "earlier pieces of the query's own word", same_word, "token"),
        Template("previous-word", "every piece of the word before the query's word", previous_word, "token"),
        Template("sentence-start", "the first token of the query's sentence", sentence_start, "structure"),
        Template(
            "line-start", "the first token of the query's line (after a line break)", line_start, "structure"
        ),
    ]
    out += [
        Template(
            f"last-delimiter:{label}",
            f"the most recent {mark!r} before the query",
            last_delimiter(mark),
            "structure",
        )
        for label, mark in DELIMITERS.items()
    ]
    out += [
        Template("bracket-open", "the bracket that the query closes", bracket_open, "structure"),
        Template("dep-head", "the head word of the query's word (parsed text)", dep_head, "syntax"),
        Template("dep-child", "the dependents of the query's word (parsed text)", dep_child, "syntax"),
    ]
    out += [
        Template(f"key-class:{c}", f"uniform over earlier {c.replace('-', ' ')}s", key_class(c), "key-class")
        for c in KEY_CLASSES
    ]
    return out


TEMPLATE_NAME = re.compile(r"^[a-z][a-z0-9_+.\-]*(:[^\s,]+)?$")


def _accept(obj: Any) -> Template:
    if not isinstance(obj, Template):
        raise TypeError(f"{obj!r} is not a template: give a headscope Template")
    if not isinstance(obj.name, str) or not TEMPLATE_NAME.match(obj.name):
        raise InputError(
            f"template name {obj.name!r} is not usable",
            hint="lower-case letters, digits, '-', '+', '.', '_', optionally ':' and a label",
        )
    if not callable(obj.targets):
        raise TypeError(f"template {obj.name!r}: targets must be a function of a Text")
    if obj.kind not in KINDS:
        raise InputError(
            f"template {obj.name!r}: kind {obj.kind!r} is not one of the atlas's kinds",
            hint=f"choose from {', '.join(KINDS)}",
        )
    if obj.family and not TEMPLATE_NAME.match(obj.family):
        raise InputError(f"template {obj.name!r}: family {obj.family!r} is not usable as a template name")
    return obj


def _clash(new: Template, registered: dict[str, Template]) -> str | None:
    """A template's reported name (its family, or its name) must say one thing in an atlas: a name
    may not be another template's family (``decay``), nor a family another template's name, and
    the members of one family share its kind."""
    for other in registered.values():
        if new.name == other.reported and other.family:
            return f"is the name of the built-in family {other.family!r} ({other.name}, …) in an atlas"
        if new.family and new.family == other.name:
            return f"its family {new.family!r} is the name of another template"
        if new.family and new.family == other.family and new.kind != other.kind:
            return f"family {new.family!r} is of kind {other.kind!r}, not {new.kind!r}"
    return None


TEMPLATES: Registry[Template] = Registry(
    "template", "headscope.templates", _accept, lambda t: t.name, clash=_clash
)
for _template in _builtins():
    TEMPLATES.add_builtin(_template)


def chosen_templates(causal: bool, names: Sequence[str] | None = None) -> list[Template]:
    """The templates a model is described with (encoder-only ones for encoders only). Named ones
    are taken once each; an encoder-only one named for a causal model is refused (it looks at keys
    after the query, which a causal model never sees)."""
    if names is not None:
        names = list(dict.fromkeys(names))  # a name given twice would be fitted as two templates
        unknown = [n for n in names if n not in TEMPLATES]
        if unknown:
            raise InputError(
                f"unknown template{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
                hint=f"choose from {', '.join(TEMPLATES)}",
            )
        ahead = [n for n in names if causal and TEMPLATES[n].encoder_only]
        if ahead:
            raise InputError(
                f"--templates {', '.join(ahead)}: encoder-only (keys after the query, or the final "
                "special token), which a causal model never attends to",
                hint="leave them out for a causal model",
            )
        return [TEMPLATES[n] for n in names]
    return [t for t in TEMPLATES.values() if not (causal and t.encoder_only)]


def template_targets(template: Template, text: Text) -> Targets:
    """``template``'s targets in ``text``, checked: integer positions inside the window, finite
    non-negative weights, and keys a causal model can see. A template that breaks this is named."""
    try:
        found = template.targets(text)
        queries, keys, weights = (np.asarray(a) for a in found)
    except Exception as exc:  # noqa: BLE001 - a user's template is named, whatever it raised
        raise InputError(
            f"template {template.name!r} failed on {text.name}: {type(exc).__name__}: {exc}",
            hint="a template's targets(text) returns (queries, keys, weights) arrays",
        ) from exc
    n = len(text)
    for what, array in (("queries", queries), ("keys", keys), ("weights", weights)):
        if array.ndim != 1:
            raise InputError(
                f"template {template.name!r}: {what} is an array of shape {tuple(array.shape)} on "
                f"{text.name}, not one dimension",
                hint="return three flat arrays (queries, keys, weights) of one length",
            )
    if not (len(queries) == len(keys) == len(weights)):
        raise InputError(f"template {template.name!r}: queries, keys and weights differ in length")
    if len(queries) == 0:
        return queries.astype(np.int64), keys.astype(np.int64), weights.astype(np.float64)
    if queries.dtype.kind not in "iu" or keys.dtype.kind not in "iu":
        raise InputError(f"template {template.name!r}: queries and keys must be integer positions")
    if queries.min() < 0 or keys.min() < 0 or queries.max() >= n or keys.max() >= n:
        raise InputError(f"template {template.name!r}: a position outside the window of {n} tokens")
    weights = weights.astype(np.float64)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise InputError(f"template {template.name!r}: weights must be finite and non-negative")
    keep = weights > 0
    if text.causal:
        keep &= keys <= queries
    return queries[keep].astype(np.int64), keys[keep].astype(np.int64), weights[keep]
