"""Each template's targets on hand-written English and Chinese sentences (tokens and parses written
by hand, so no tokenizer is involved), and the refusals of a broken user template."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from headscope.analyses.describe.fit import TemplateMaps
from headscope.analyses.describe.templates import (
    QUERY_CLASSES,
    TEMPLATES,
    Rule,
    Template,
    chosen_templates,
    make_text,
    template_targets,
)
from headscope.errors import InputError


def tokens_of(text: str, pieces: list[str]) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    """BOS, then ``pieces`` found in order in ``text`` (ids: a piece's first occurrence index)."""
    ids, offsets, at, vocab = [1], [(0, 0)], 0, {}
    for piece in pieces:
        start = text.index(piece, at)
        offsets.append((start, start + len(piece)))
        at = start + len(piece)
        ids.append(10 + vocab.setdefault(piece.strip(), len(vocab)))
    return ids, [True] + [False] * len(pieces), offsets


EN = "The cat (who ran) sat.\nIt ran, then sat down."
EN_PIECES = [
    "The",
    " cat",
    " (",
    "who",
    " ran",
    ")",
    " sat",
    ".",
    "\n",
    "It",
    " ran",
    ",",
    " then",
    " sat",
    " down",
    ".",
]


@pytest.fixture(scope="module")
def english():
    ids, special, offsets = tokens_of(EN, EN_PIECES)
    return make_text("en", ids, special, offsets, EN, vocab_size=1000)


def pairs(name: str, text) -> set[tuple[int, int]]:
    q, k, _ = template_targets(TEMPLATES[name], text)
    return set(zip(q.tolist(), k.tolist(), strict=True))


def targets_at(name: str, text, query: int) -> list[int]:
    return sorted(k for q, k in pairs(name, text) if q == query)


def test_positions(english):
    # token 7 is " sat" (index 0 is BOS)
    assert targets_at("sink", english, 7) == [0]
    assert targets_at("self", english, 7) == [7]
    assert targets_at("offset-1", english, 7) == [6]
    assert targets_at("offset-3", english, 7) == [4]
    assert targets_at("local-4", english, 7) == [4, 5, 6, 7]
    assert targets_at("broad", english, 3) == [0, 1, 2, 3]
    assert not targets_at("offset-1", english, 0)  # BOS is not a query
    q, k, w = template_targets(TEMPLATES["decay-0.5"], english)
    at7 = {int(b): float(c) for a, b, c in zip(q, k, w, strict=True) if a == 7}
    assert at7[7] == 1.0 and at7[6] == 0.5 and at7[5] == 0.25


def test_tokens(english):
    # " sat" at 7 and 14, " ran" at 5 and 11 (same id: leading spaces stripped in tokens_of)
    assert targets_at("same-token", english, 14) == [7]
    assert targets_at("induction", english, 14) == [8]  # the "." after the earlier " sat"
    assert targets_at("same-token", english, 11) == [5]
    assert targets_at("induction", english, 11) == [6]
    assert not targets_at("same-token", english, 7)  # first occurrence
    assert targets_at("previous-word", english, 13) == [12]  # " then" -> ","


def test_structure(english):
    # sentences: "The cat (who ran) sat." then "It ran, then sat down."
    assert targets_at("sentence-start", english, 7) == [1]
    assert targets_at("sentence-start", english, 14) == [10]
    assert targets_at("line-start", english, 14) == [10]
    assert not targets_at("line-start", english, 7)  # no line break before it
    assert targets_at("last-delimiter:period", english, 14) == [8]
    assert targets_at("last-delimiter:comma", english, 14) == [12]
    assert targets_at("last-delimiter:newline", english, 14) == [9]
    assert targets_at("bracket-open", english, 6) == [3]
    assert targets_at("key-class:punctuation", english, 7) == [3, 6]
    assert targets_at("key-class:capitalised", english, 14) == [1, 10]
    assert 11 in targets_at("key-class:content-word", english, 14)
    assert targets_at("key-class:function-word", english, 7) == [1, 4]  # "The", "who"


def test_query_classes(english):
    classes = [QUERY_CLASSES[c] if c >= 0 else None for c in english.query_classes()]
    assert classes[0] is None  # BOS
    assert classes[1] == "function-word"  # The
    assert classes[2] == "content-word"  # cat
    assert classes[6] == "punctuation"  # )
    assert classes[10] == "line-start"  # It, after the line break


def test_subword_pieces():
    text = "Unbelievably fast."
    ids, special, offsets = tokens_of(text, ["Un", "believ", "ably", " fast", "."])
    found = make_text("pieces", ids, special, offsets, text)
    assert targets_at("same-word", found, 3) == [1, 2]
    assert targets_at("previous-word", found, 4) == [1, 2, 3]
    classes = [QUERY_CLASSES[c] for c in found.query_classes()[1:]]
    assert classes == [
        "content-word",
        "word-continuation",
        "word-continuation",
        "content-word",
        "punctuation",
    ]


def test_syntax_from_a_parse():
    text = "Dogs chase cats."
    ids, special, offsets = tokens_of(text, ["Dogs", " chase", " cats", "."])
    spans = [(0, 4), (5, 10), (11, 15), (15, 16)]
    found = make_text("parsed", ids, special, offsets, text, spans=spans, heads=[1, -1, 1, 1], causal=False)
    assert targets_at("dep-head", found, 1) == [2]  # Dogs -> chase
    assert targets_at("dep-child", found, 2) == [1, 3, 4]  # chase -> Dogs, cats, "."
    assert targets_at("offset+1", found, 1) == [2]  # encoders look ahead too
    unparsed = make_text("plain", ids, special, offsets, text)
    assert not pairs("dep-head", unparsed)


ZH = "我的猫跑了、狗也跑了。它（小猫）很快。"


@pytest.fixture(scope="module")
def chinese():
    pieces = list(ZH)
    ids, special, offsets = tokens_of(ZH, pieces)
    return make_text("zh", ids, special, offsets, ZH, lang="zh")


def test_chinese(chinese):
    # 1 我 2 的 3 猫 4 跑 5 了 6 、 7 狗 8 也 9 跑 10 了 11 。 12 它 13 （ 14 小 15 猫 16 ） 17 很 18 快 19 。
    assert targets_at("same-token", chinese, 9) == [4]
    assert targets_at("induction", chinese, 9) == [5]
    assert targets_at("last-delimiter:dunhao", chinese, 9) == [6]
    assert targets_at("last-delimiter:juhao", chinese, 17) == [11]
    assert targets_at("sentence-start", chinese, 17) == [12]
    assert targets_at("bracket-open", chinese, 16) == [13]
    assert targets_at("previous-word", chinese, 3) == [2]  # one CJK character, one word
    assert targets_at("key-class:function-word", chinese, 5) == [1, 2]  # 我, 的
    classes = [QUERY_CLASSES[c] for c in chinese.query_classes()[1:]]
    assert classes[1] == "function-word" and classes[2] == "content-word" and classes[5] == "punctuation"


@pytest.mark.parametrize("causal", [True, False])
def test_a_rule_draws_the_pairs_it_lists(english, causal):
    """The dense templates (local, decay, broad, key classes) are rules: the rows describe draws
    from a rule, for any range of queries and keys (past the window's end included), are its listed
    pairs drawn densely, and TemplateMaps.named says what the listed pairs say."""
    text = dataclasses.replace(english, causal=causal, _cache={})
    n = len(text)
    rules = [t for t in chosen_templates(causal) if isinstance(t.targets, Rule)]
    assert {t.name for t in rules} >= {"local-4", "decay-0.5", "broad", "key-class:punctuation"}
    for template in rules:
        q, k, w = template_targets(template, text)
        dense = np.zeros((n + 4, n + 4))
        dense[q, k] = w
        for start, stop, keys in [(0, n, n), (3, 9, 9), (5, n + 4, n + 4), (2, 12, 7)]:
            drawn = template.targets.grid(text, start, stop, keys)
            assert np.array_equal(drawn, dense[start:stop, :keys]), (template.name, start, stop, keys)
    templates = chosen_templates(causal)
    named = TemplateMaps(templates, [text]).named(0)
    for template, found in zip(templates, named, strict=True):
        q, _, _ = template_targets(template, text)
        assert found == bool(((q > 0) & text.content[q]).any()), template.name


def test_a_broken_template_is_named(english):
    def returns_floats(text):
        return np.array([1.5]), np.array([0.0]), np.array([1.0])

    with pytest.raises(InputError, match="'halves'.*integer"):
        template_targets(Template("halves", "bad", returns_floats), english)

    def raises(text):
        raise ZeroDivisionError("no")

    with pytest.raises(InputError, match="'raises' failed on en: ZeroDivisionError"):
        template_targets(Template("raises", "bad", raises), english)

    def outside(text):
        return np.array([3]), np.array([99]), np.array([1.0])

    with pytest.raises(InputError, match="outside the window"):
        template_targets(Template("outside", "bad", outside), english)


def test_a_causal_template_never_reaches_ahead(english):
    def ahead(text):
        return np.array([2, 2]), np.array([1, 5]), np.array([1.0, 1.0])

    q, k, _ = template_targets(Template("ahead", "later keys dropped", ahead), english)
    assert k.tolist() == [1]


def test_sep_is_the_encoders_last_special_token():
    text = "Dogs bark."
    ids, special, offsets = tokens_of(text, ["Dogs", " bark", "."])
    ids, special, offsets = ids + [2], special + [True], offsets + [(0, 0)]  # ... [SEP]
    found = make_text("encoder", ids, special, offsets, text, causal=False)
    assert targets_at("sep", found, 1) == [4] and targets_at("sep", found, 3) == [4]
    assert targets_at("sink", found, 2) == [0]


def test_a_template_returning_columns_is_named(english):
    def columns(text):
        queries = np.arange(1, len(text))[:, None]  # a column, not a flat array
        return queries, queries - 1, np.ones(len(queries))

    with pytest.raises(InputError, match=r"'columns': queries is an array of shape \(\d+, 1\) on en"):
        template_targets(Template("columns", "bad", columns), english)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            Template("mine", "x", lambda t: None, kind="copying"),
            "kind 'copying' is not one of the atlas's kinds",
        ),
        (Template("decay", "x", lambda t: None, kind="diffuse"), "name of the built-in family 'decay'"),
        (Template("mine", "x", lambda t: None, kind="sink", family="sink"), "family 'sink' is the name of"),
        (
            Template("decay-0.3", "x", lambda t: None, kind="offset", family="decay", param=0.3),
            "family 'decay' is of kind 'diffuse'",
        ),
    ],
)
def test_a_template_that_would_break_the_atlas_is_refused(template, message):
    import headscope as hs

    with pytest.raises(InputError, match=message):
        hs.register(template)


def test_a_new_member_of_a_family_is_welcome():
    import headscope as hs
    from headscope.analyses.describe.templates import TEMPLATES, decay

    hs.register(Template("decay-0.3", "x", decay(0.3), kind="diffuse", family="decay", param=0.3))
    try:
        assert TEMPLATES["decay-0.3"].reported == "decay"
    finally:
        TEMPLATES.unregister("decay-0.3")
