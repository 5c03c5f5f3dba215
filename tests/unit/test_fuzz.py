"""Fuzzing the parsers and the alignment: random input either parses correctly or is rejected
with a HeadscopeError (a clean one-line error), and never crashes with anything else."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from headscope.data.align import AlignmentError, encode_with_spans
from headscope.data.circuits import load_ioi, load_retrieval
from headscope.data.conllu import read_conllu
from headscope.data.ordinal import load_ordinal
from headscope.data.prompts import load_coref, load_texts
from headscope.errors import HeadscopeError
from headscope.extend.show import word_spans
from headscope.models import bundled_path
from headscope.outputs.compare import read_scan_csv

# The profile loaded in conftest.py (derandomized in CI, "dev" elsewhere) is the parent: these
# tests set only how many examples they draw and the fixture health check.
FUZZ = settings(
    settings.default, max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# Text with CJK, emoji, combining marks and controls, but no lone surrogates (not encodable).
ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
HARD_TEXT = st.text(
    alphabet=st.sampled_from(
        list("ab c.,'\n\t") + ["我", "喜", "欢", "。", "\u0301", "\u200d", "👩", "🎉", "\ufe0f", "é"]
    ),
    min_size=1,
    max_size=30,
)


def file_with(suffix: str, data: bytes) -> Path:
    with tempfile.NamedTemporaryFile(suffix=suffix, delete=False) as handle:
        handle.write(data)
    return Path(handle.name)


def parses_or_clean_error(load, path: Path):
    try:
        return load(path)
    except HeadscopeError as exc:
        assert str(exc).strip() and "\n" not in str(exc).strip().splitlines()[0]
        return None
    finally:
        path.unlink(missing_ok=True)


@FUZZ
@given(st.sampled_from([".yaml", ".jsonl", ".txt"]), st.binary(max_size=200))
def test_text_sets_from_random_bytes(suffix, data):
    loaded = parses_or_clean_error(load_texts, file_with(suffix, data))
    if loaded is not None:
        assert loaded.items and all(isinstance(item.text, str) and item.text.strip() for item in loaded.items)


@FUZZ
@given(st.lists(HARD_TEXT | ANY_TEXT, min_size=1, max_size=5), st.sampled_from([".yaml", ".jsonl"]))
def test_text_sets_round_trip_any_unicode(texts, suffix):
    """Valid files with arbitrary text give back exactly that text (or a clean error for blank ones).

    "Exactly" means as the format reads it: YAML treats NEL, LS and PS as line breaks and folds
    them inside a scalar, so PyYAML itself does not read back '0\x85' as dumped; the expected texts
    are what a plain ``yaml.safe_load`` of the same file gives.
    """
    items = [{"text": t} for t in texts]
    if suffix == ".yaml":
        data = yaml.safe_dump({"items": items}, allow_unicode=True).encode()
        expected = [item["text"] for item in yaml.safe_load(data)["items"]]
    else:
        data = "\n".join(json.dumps(i, ensure_ascii=False) for i in items).encode()
        expected = texts
    loaded = parses_or_clean_error(load_texts, file_with(suffix, data))
    if loaded is not None:
        assert [item.text for item in loaded.items] == expected
    elif suffix == ".jsonl":
        # JSONL lines end at "\n" only: U+2028, \x85 and the like inside a string are text.
        assert any(not t.strip() for t in texts) or len(set(texts)) < len(texts)
    else:
        assert (
            any(not t.strip() for t in texts)
            or len(set(texts)) < len(texts)
            or any("\r" in t or "\x85" in t or "\u2028" in t or "\u2029" in t for t in texts)
        )


# --- documents of the wrong shape: needle sets, IOI sets, ordinal task sets --------------------

SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | ANY_TEXT
    | HARD_TEXT
)
ANY_VALUE = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)
# Unquoted YAML scalars that read as something other than text: octal, hex, booleans, null.
YAML_TRAPS = st.sampled_from(
    ["010", "0755", "0x1F", "1e3", "1.50", "yes", "off", "~", "", "[a, b]", "{a: 1}", "'x'"]
)


def item_of(keys: list[str]):
    """A mapping with some of the schema's keys (random values) and maybe a stray key."""
    return st.fixed_dictionaries({}, optional={key: ANY_VALUE | HARD_TEXT for key in [*keys, "extra"]})


def document(keys: list[str]):
    items = st.lists(item_of(keys) | ANY_VALUE, max_size=4)
    return (
        ANY_VALUE
        | st.fixed_dictionaries({"items": items | ANY_VALUE}, optional={"name": ANY_VALUE})
        | st.fixed_dictionaries({"items": items})
    )


def dumped(doc, suffix: str) -> bytes:
    if suffix == ".yaml":
        return yaml.safe_dump(doc, allow_unicode=True).encode()
    rows = doc.get("items") if isinstance(doc, dict) else doc
    rows = rows if isinstance(rows, list) else [rows]
    return "\n".join(json.dumps(row, ensure_ascii=False) for row in rows).encode()


def yaml_with_traps(keys: list[str], values: list[str]) -> bytes:
    lines = ["items:"]
    for index, value in enumerate(values):
        key = keys[index % len(keys)]
        lines.append(("- " if index % len(keys) == 0 else "  ") + f"{key}: {value}")
    return ("\n".join(lines) + "\n").encode()


NEEDLE_KEYS = ["id", "lang", "needle", "question", "answer"]
IOI_KEYS = ["id", "lang", "template", "text", "io", "s"]


@FUZZ
@given(document(NEEDLE_KEYS), st.sampled_from([".yaml", ".jsonl"]))
def test_needle_sets_of_the_wrong_shape(doc, suffix):
    loaded = parses_or_clean_error(load_retrieval, file_with(suffix, dumped(doc, suffix)))
    if loaded is not None:
        for item in loaded.items:
            assert item.answer_span[0] > 0 and item.answer not in item.question


@FUZZ
@given(document(IOI_KEYS), st.sampled_from([".yaml", ".jsonl"]))
def test_ioi_sets_of_the_wrong_shape(doc, suffix):
    loaded = parses_or_clean_error(load_ioi, file_with(suffix, dumped(doc, suffix)))
    if loaded is not None:
        for item in loaded.items:
            assert item.io != item.s and item.io in item.text and item.text.count(item.s) >= 2


@FUZZ
@given(st.lists(YAML_TRAPS | HARD_TEXT.map(json.dumps), min_size=1, max_size=10), st.booleans())
def test_needle_and_ioi_yaml_scalars_that_are_not_text(values, needles):
    keys, load = (NEEDLE_KEYS[2:], load_retrieval) if needles else (IOI_KEYS[3:], load_ioi)
    loaded = parses_or_clean_error(load, file_with(".yaml", yaml_with_traps(keys, values)))
    if loaded is not None:
        assert all(isinstance(getattr(item, keys[0]), str) for item in loaded.items)


ORDINAL_TASK = st.fixed_dictionaries(
    {},
    optional={
        "name": ANY_VALUE | HARD_TEXT,
        "members": st.lists(HARD_TEXT | SCALAR, max_size=6) | ANY_VALUE,
        "extra": ANY_VALUE,
    },
)


@FUZZ
@given(
    ANY_VALUE
    | st.fixed_dictionaries(
        {"tasks": st.lists(ORDINAL_TASK | ANY_VALUE, max_size=4) | ANY_VALUE},
        optional={"name": ANY_VALUE, "lang": ANY_VALUE, "description": ANY_VALUE},
    )
)
def test_ordinal_sets_of_the_wrong_shape(doc):
    loaded = parses_or_clean_error(load_ordinal, file_with(".yaml", dumped(doc, ".yaml")))
    if loaded is not None:
        assert loaded.tasks and len({task.name for task in loaded.tasks}) == len(loaded.tasks)
        for task in loaded.tasks:
            assert len(task.members) >= 3 and all(isinstance(m, str) and m.strip() for m in task.members)


@FUZZ
@given(st.lists(YAML_TRAPS | HARD_TEXT.map(json.dumps), min_size=1, max_size=8))
def test_ordinal_members_that_are_not_text(members):
    text = "tasks:\n  - name: t\n    members:\n" + "".join(f"      - {m}\n" for m in members)
    loaded = parses_or_clean_error(load_ordinal, file_with(".yaml", text.encode()))
    if loaded is not None:
        assert all(isinstance(m, str) for m in loaded.tasks[0].members)


SPAN = (
    st.lists(st.integers(-3, 45), min_size=2, max_size=2)
    | st.just("x")
    | st.lists(st.integers(0, 5), max_size=3)
)


@FUZZ
@given(ANY_TEXT | HARD_TEXT, SPAN, st.lists(SPAN, max_size=4), st.integers(-1, 4))
def test_coref_sets_with_random_spans(text, pronoun, candidates, antecedent):
    item = {"text": text, "pronoun": pronoun, "candidates": candidates, "antecedent": antecedent}
    data = yaml.safe_dump({"items": [item]}, allow_unicode=True).encode()
    loaded = parses_or_clean_error(load_coref, file_with(".yaml", data))
    if loaded is not None:
        (example,) = loaded.items
        for start, end in [example.pronoun, *example.candidates]:
            assert 0 <= start < end <= len(example.text)
        assert 0 <= example.antecedent < len(example.candidates)


COLUMN = st.text(alphabet=st.sampled_from(list("ab1_\t-.") + ["我", "é"]), max_size=4)


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(-1, 6),
            COLUMN,
            st.integers(-2, 7),
            st.sampled_from(["det", "nsubj", "", "obj:x", "root"]),
            st.booleans(),
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_conllu_from_random_rows(rows, blank_between):
    lines = []
    for word_id, form, head, deprel, mangle in rows:
        columns = [str(word_id), form, "_", "_", "_", "_", str(head), deprel, "_", "_"]
        lines.append("\t".join(columns[:7] if mangle else columns))
        if blank_between and word_id == 0:
            lines.append("")
    data = ("\n".join(lines) + "\n\n").encode()
    loaded = parses_or_clean_error(read_conllu, file_with(".conllu", data))
    if loaded is not None:
        for sentence in loaded.sentences:
            n = len(sentence.words)
            for word in sentence.words:
                assert -1 <= word.head < n and word.head != sentence.words.index(word)


@FUZZ
@given(st.binary(max_size=300) | ANY_TEXT.map(str.encode))
def test_scan_csv_from_random_bytes(data):
    loaded = parses_or_clean_error(read_scan_csv, file_with(".csv", data))
    if loaded is not None:
        assert len(loaded) > 0 and (loaded["layer"] >= 0).all()


@pytest.fixture(scope="module")
def wordpiece():
    return AutoTokenizer.from_pretrained(str(bundled_path("minilm-l6")))


@FUZZ
@given(HARD_TEXT | ANY_TEXT)
def test_show_words_align_or_are_rejected(wordpiece, text):
    """`show --words` segmentation on any text: spans are inside the text, in order, never empty,
    and they align to the tokens or raise AlignmentError (never anything else)."""
    spans = word_spans(text)
    assert all(0 <= a < b <= len(text) for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:], strict=False))
    assert all(text[a:b].strip() for a, b in spans)
    assume(spans)
    try:
        ids, _, to_word, from_word = encode_with_spans(wordpiece, text, spans)
    except AlignmentError:
        assert uncovered_spans(wordpiece, text, spans), (text, spans)  # a refusal must be earned
        return
    assert to_word.shape == from_word.shape == (len(ids), len(spans))
    assert not uncovered_spans(wordpiece, text, spans)


def random_spans(text: str, data) -> list[tuple[int, int]]:  # noqa: ANN001
    """Adjacent spans that tile the text at random cut points (any character may be cut)."""
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=6)) + [0, len(text)]))
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def uncovered_spans(tokenizer, text: str, spans: list[tuple[int, int]]) -> list[int]:
    """The spans that alignment must refuse, found from the tokenizer's own output.

    A span is refused when it is empty or outside the text, or when no non-special token's
    character offsets overlap it. Computed here from the offset mapping and the special-tokens
    mask, not with headscope.data.align, so that a refusal in the tests below has to be earned.
    """
    encoding = tokenizer(
        text, add_special_tokens=True, return_offsets_mapping=True, return_special_tokens_mask=True
    )
    tokens = [
        (start, end)
        for (start, end), special in zip(
            encoding["offset_mapping"], encoding["special_tokens_mask"], strict=True
        )
        if not special
    ]
    return [
        w
        for w, (a, b) in enumerate(spans)
        if not 0 <= a < b <= len(text) or not any(min(end, b) > max(start, a) for start, end in tokens)
    ]


def check_alignment(tokenizer, text: str, spans: list[tuple[int, int]]) -> str:
    """Random spans on random text: maps that match the offsets, or an AlignmentError exactly
    when some span has no overlapping non-special token. Returns which of the two happened."""
    try:
        ids, special, to_word, from_word = encode_with_spans(tokenizer, text, spans)
    except AlignmentError:
        assert uncovered_spans(tokenizer, text, spans), (text, spans)  # a refusal must be earned
        return "refused"
    assert not uncovered_spans(tokenizer, text, spans)
    offsets = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)["offset_mapping"]
    assert to_word.shape == from_word.shape == (len(ids), len(spans))
    sums = to_word.sum(1)
    assert all(abs(float(v) - 1) < 1e-5 or float(v) == 0 for v in sums)  # all of a token's mass, or none
    assert all(abs(float(v) - 1) < 1e-5 for v in from_word.sum(0))  # every span is read from
    for t, (start, end) in enumerate(offsets):
        for w, (a, b) in enumerate(spans):
            overlaps = not special[t] and min(end, b) > max(start, a)
            assert (float(to_word[t, w]) > 0) == overlaps
            assert (float(from_word[t, w]) > 0) == overlaps
    return "aligned"


@pytest.mark.slow
@FUZZ
@given(HARD_TEXT | ANY_TEXT, st.data())
def test_byte_level_bpe_alignment_with_random_spans(smollm2, text, data):
    """SmolLM2's byte-level BPE (CJK split into byte tokens, merges across words) on random text."""
    assume(text)
    event(check_alignment(smollm2.tokenizer, text, random_spans(text, data)))


@FUZZ
@given(HARD_TEXT | ANY_TEXT, st.data())
def test_wordpiece_alignment_with_random_spans(wordpiece, text, data):
    assume(text)
    event(check_alignment(wordpiece, text, random_spans(text, data)))  # --hypothesis-show-statistics


def test_alignment_refusals_are_checked_against_the_offsets(wordpiece, monkeypatch):
    """The fuzz checks above are not vacuous: a coverable span must align, an uncoverable one
    must be refused, and an aligner that refused everything would fail them."""
    text = "ab  cd"
    assert uncovered_spans(wordpiece, text, [(0, 2), (4, 6)]) == []
    assert uncovered_spans(wordpiece, text, [(0, 2), (2, 4)]) == [1]  # only spaces: no token
    assert uncovered_spans(wordpiece, text, [(0, 9)]) == [0]  # outside the text
    assert check_alignment(wordpiece, text, [(0, 2), (4, 6)]) == "aligned"
    assert check_alignment(wordpiece, text, [(0, 2), (2, 4)]) == "refused"

    def refuse(*args, **kwargs):
        raise AlignmentError("refused")

    monkeypatch.setattr(sys.modules[__name__], "encode_with_spans", refuse)
    with pytest.raises(AssertionError):
        check_alignment(wordpiece, text, [(0, 2), (4, 6)])
