"""Circuit data: IOI and needle-in-a-haystack loaders, the shipped sets, and their tokenization."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from headscope.data.circuits import (
    IOIItem,
    NeedleItem,
    load_haystack,
    load_ioi,
    load_retrieval,
    occurrences,
    split_sentences,
)
from headscope.data.prompts import builtin
from headscope.errors import PromptSetError

SIX_DIGITS = re.compile(r"[1-9]\d{5}")


def _yaml(tmp_path: Path, name: str, items: str) -> Path:
    """A YAML set whose first item starts on line 4."""
    path = tmp_path / name
    path.write_text(f"name: test\ndescription: a test set\nitems:\n{items}", encoding="utf-8")
    return path


def _jsonl(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n", encoding="utf-8")
    return path


def _error(load, path: Path) -> str:
    with pytest.raises(PromptSetError) as info:
        load(path)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "\n" not in message
    return message


GOOD_IOI = {"text": "When Mary and John went to the store, John gave a drink to", "io": "Mary", "s": "John"}
GOOD_NEEDLE = {
    "needle": "The secret code of the blue lighthouse is 482913.",
    "question": "What is the secret code of the blue lighthouse?",
    "answer": "482913",
}


# --- shipped sets --------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_shipped_ioi_sets(lang: str) -> None:
    ioi = load_ioi(builtin(f"ioi/{lang}.yaml"))
    assert ioi.name == f"ioi-{lang}" and ioi.description
    assert len(ioi.items) >= 150
    assert len({item.template for item in ioi.items}) >= 4
    assert len({item.text for item in ioi.items}) == len(ioi.items)
    names = set()
    orders = set()
    for item in ioi.items:
        assert item.lang == lang
        io_spans, s_spans = occurrences(item.text, item.io), occurrences(item.text, item.s)
        assert len(io_spans) >= 1 and len(s_spans) >= 2, item
        assert item.io != item.s and item.text == item.text.rstrip()
        orders.add(io_spans[0][0] < s_spans[0][0])
        names.update((item.io, item.s))
    assert orders == {True, False}  # ABBA and BABA
    assert len(names) >= (20 if lang == "en" else 16)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_shipped_retrieval_sets(lang: str) -> None:
    needles = load_retrieval(builtin(f"retrieval/{lang}.yaml"))
    assert needles.name == f"retrieval-{lang}"
    assert len(needles.items) >= 12
    assert len({item.answer for item in needles.items}) == len(needles.items)
    for item in needles.items:
        assert SIX_DIGITS.fullmatch(item.answer), item
        start, end = item.answer_span
        assert start > 0 and item.needle[start:end] == item.answer
        assert item.needle.startswith(item.answer_prefix) and item.answer_prefix
        assert item.answer not in item.question


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_shipped_haystacks(lang: str) -> None:
    path = builtin(f"retrieval/haystack-{lang}.txt")
    sentences = load_haystack(path)
    assert len(sentences) >= 100
    assert len(set(sentences)) == len(sentences)
    assert not re.search(r"\d", path.read_text(encoding="utf-8"))
    end = "." if lang == "en" else "。"
    assert sum(s.endswith(end) for s in sentences) >= 0.8 * len(sentences)
    if lang == "en":
        assert len(path.read_text(encoding="utf-8").split()) >= 2600
    else:
        assert len(re.sub(r"\s", "", path.read_text(encoding="utf-8"))) >= 4000


# --- occurrences and sentences -------------------------------------------------------------------


def test_occurrences_respect_word_boundaries_for_latin_names() -> None:
    text = "Anna met Ann, and Ann thanked Anna. Annabel waved to Ann"
    assert occurrences(text, "Ann") == [(9, 12), (18, 21), (53, 56)]
    assert occurrences(text, "Anna") == [(0, 4), (30, 34)]
    assert occurrences("Mary和John去了商店，John把书给了", "John") == [(5, 9), (14, 18)]
    assert occurrences("Mary", "") == []


def test_occurrences_are_plain_substrings_for_cjk_names() -> None:
    text = "小明和小红去了商店，小明把饮料给了"
    assert occurrences(text, "小明") == [(0, 2), (10, 12)]
    assert occurrences(text, "小红") == [(3, 5)]
    assert occurrences("明明明明", "明明") == [(0, 2), (2, 4)]  # non-overlapping


def test_split_sentences_english_and_chinese() -> None:
    text = "The river bends. Does it?  Yes!\nHe said “fine.” Then left. 天气很好。你去吗？去！“好。”然后走了"
    assert split_sentences(text) == [
        "The river bends.",
        "Does it?",
        "Yes!",
        "He said “fine.”",
        "Then left.",
        "天气很好。",
        "你去吗？",
        "去！",
        "“好。”",
        "然后走了",
    ]


def test_needle_properties() -> None:
    item = NeedleItem("x", GOOD_NEEDLE["needle"], GOOD_NEEDLE["question"], GOOD_NEEDLE["answer"])
    assert item.answer_span == (42, 48)
    assert item.answer_prefix == "The secret code of the blue lighthouse is "


# --- good files ----------------------------------------------------------------------------------


def test_load_ioi_yaml_and_jsonl(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "ioi.yaml",
        "- id: a\n  lang: en\n  template: store\n"
        "  text: When Mary and John went to the store, John gave a drink to\n  io: Mary\n  s: John\n"
        "- text: 小明和张伟去了商店，小明把饮料给了\n  io: 张伟\n  s: 小明\n",
    )
    ioi = load_ioi(path)
    assert ioi.name == "test" and ioi.description == "a test set"
    assert ioi.items[0] == IOIItem("a", GOOD_IOI["text"], "Mary", "John", "en", "store", f"{path}:4")
    assert ioi.items[1].id == "ioi-2" and ioi.items[1].source == f"{path}:10"
    rows = _jsonl(tmp_path, "ioi.jsonl", [GOOD_IOI, {**GOOD_IOI, "id": "b"}])
    assert [item.id for item in load_ioi(rows).items] == ["ioi-1", "b"]


def test_load_retrieval_jsonl(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "needles.jsonl", [GOOD_NEEDLE, {**GOOD_NEEDLE, "id": "z", "lang": "en"}])
    needles = load_retrieval(path)
    assert needles.name == "needles"
    assert [item.id for item in needles.items] == ["needles-1", "z"]
    assert needles.items[1].source == f"{path}:2"


def test_load_haystack_conllu(tmp_path: Path) -> None:
    path = tmp_path / "hay.conllu"
    blocks = [f"# sent_id = {i}\n# text = Sentence {'abcdef'[i]} is here.\n1\tx\tx\tX\t_\t_\t0\troot\t_\t_\n"
              for i in range(6)]  # fmt: skip
    path.write_text("# newdoc\n" + "\n".join(blocks), encoding="utf-8")
    assert load_haystack(path) == [f"Sentence {c} is here." for c in "abcdef"]


# --- bad files -----------------------------------------------------------------------------------


def test_answer_not_in_needle(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "needles.yaml",
        f"- id: n1\n  needle: {GOOD_NEEDLE['needle']}\n  question: {GOOD_NEEDLE['question']}\n"
        "  answer: '482914'\n",
    )
    message = _error(load_retrieval, path)
    assert message.startswith(f"{path}:4: item 'n1': ")
    assert "'answer'" in message and "does not occur in 'needle'" in message


def test_answer_starting_the_needle(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "needles.jsonl", [GOOD_NEEDLE, {**GOOD_NEEDLE, "needle": "482913 is the code."}])
    message = _error(load_retrieval, path)
    assert message.startswith(f"{path}:2: item 'needles-2': ") and "starts the needle" in message


def test_answer_given_as_a_number_or_in_the_question(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path, "needles.yaml", f"- needle: {GOOD_NEEDLE['needle']}\n  question: Q?\n  answer: 482913\n"
    )
    assert "quote it" in _error(load_retrieval, path)
    path = _jsonl(tmp_path, "given.jsonl", [{**GOOD_NEEDLE, "question": "Is it 482913?"}])
    assert _error(load_retrieval, path).startswith(f"{path}:1: item 'given-1': ")


def test_io_missing_from_text(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "ioi.jsonl", [GOOD_IOI, {**GOOD_IOI, "id": "x", "io": "Susan"}])
    message = _error(load_ioi, path)
    assert message.startswith(f"{path}:2: item 'x': ")
    assert "'io' (\"Susan\") does not occur in 'text'" in message


def test_s_not_repeated(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "ioi.yaml",
        "- id: en-003\n  text: When Mary and John went to the store, he gave a drink to\n"
        "  io: Mary\n  s: John\n",
    )
    message = _error(load_ioi, path)
    assert message.startswith(f"{path}:4: item 'en-003': ")
    assert "'s' (\"John\") must occur at least twice in 'text'" in message


def test_unknown_key(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "ioi.jsonl", [GOOD_IOI, GOOD_IOI | {"id": "k", "subject": "John"}])
    message = _error(load_ioi, path)
    assert message.startswith(f"{path}:2: item 'k': ") and "unknown key(s) subject" in message
    path = _yaml(
        tmp_path, "needles.yaml", f"- needle: {GOOD_NEEDLE['needle']}\n  question: Q?\n  anwser: x\n"
    )
    message = _error(load_retrieval, path)
    assert message.startswith(f"{path}:4: item 'needles-1': ") and "anwser" in message


def test_io_equals_s(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "ioi.yaml",
        "- text: When John and John went out, John gave a drink to\n  io: John\n  s: John\n",
    )
    message = _error(load_ioi, path)
    assert message.startswith(f"{path}:4: item 'ioi-1': ") and "must differ" in message


def test_name_inside_a_longer_name_does_not_count(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        "ioi.jsonl",
        [{"text": "When Anna and John went out, John gave a drink to", "io": "Ann", "s": "John"}],
    )
    message = _error(load_ioi, path)
    assert message.startswith(f"{path}:1: item 'ioi-1': ") and "'io' (\"Ann\")" in message
    path = _jsonl(
        tmp_path,
        "ioi2.jsonl",
        [{"text": "When Mary and Ann went out, Anna gave a drink to", "io": "Mary", "s": "Ann"}],
    )
    assert "found 1" in _error(load_ioi, path)


def test_other_ioi_errors(tmp_path: Path) -> None:
    cases = [
        ({**GOOD_IOI, "text": GOOD_IOI["text"] + " "}, "must not end with whitespace"),
        ({**GOOD_IOI, "io": ""}, "'io' must be a non-empty string"),
        ({"io": "Mary", "s": "John"}, "missing 'text'"),
        ({**GOOD_IOI, "template": 3}, "'template' must be a string"),
    ]
    for i, (row, expected) in enumerate(cases):
        path = _jsonl(tmp_path, f"bad{i}.jsonl", [row])
        message = _error(load_ioi, path)
        assert message.startswith(f"{path}:1: item 'bad{i}-1': ") and expected in message, message
    path = _jsonl(tmp_path, "dup.jsonl", [{**GOOD_IOI, "id": "a"}, {**GOOD_IOI, "id": "a"}])
    assert _error(load_ioi, path).startswith(f"{path}:2: duplicate id 'a'")
    path = _jsonl(tmp_path, "list.jsonl", [GOOD_IOI])
    path.write_text(path.read_text() + "[1, 2]\n", encoding="utf-8")
    assert _error(load_ioi, path).startswith(f"{path}:2: item 1 must be a mapping")


def test_haystack_too_short(tmp_path: Path) -> None:
    path = tmp_path / "hay.txt"
    path.write_text("One sentence here. Another one. A third! A fourth?", encoding="utf-8")
    message = _error(load_haystack, path)
    assert str(path) in message and "too short to hide a needle in" in message
    path = tmp_path / "hay.conllu"
    path.write_text("# text = Only one.\n1\tOnly\tonly\tADV\t_\t_\t0\troot\t_\t_\n", encoding="utf-8")
    assert "too short" in _error(load_haystack, path)


def test_haystack_wrong_suffix(tmp_path: Path) -> None:
    path = tmp_path / "hay.md"
    path.write_text("A. B. C. D. E. F.", encoding="utf-8")
    message = _error(load_haystack, path)
    assert str(path) in message and "use .txt or .conllu" in message
    assert "file not found" in _error(load_haystack, tmp_path / "missing.txt")


# --- tokenization of the shipped names (loads the bundled models) -------------------------------


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _check_names(tokenizer) -> None:
    for item in load_ioi(builtin("ioi/en.yaml")).items:
        assert len(_ids(tokenizer, " " + item.io)) == 1, item.io
        assert len(_ids(tokenizer, " " + item.s)) == 1, item.s
    for item in load_ioi(builtin("ioi/zh.yaml")).items:
        assert _ids(tokenizer, item.io)[0] != _ids(tokenizer, item.s)[0], item


@pytest.mark.slow
def test_ioi_names_tokenize_apart_in_smollm2(smollm2) -> None:
    _check_names(smollm2.tokenizer)


@pytest.mark.slow
def test_ioi_names_tokenize_apart_in_gemma3(gemma3) -> None:
    _check_names(gemma3.tokenizer)
