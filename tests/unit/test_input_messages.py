"""Bad data files give one short line that names the real cause (issue 23): YAML numbers are
quoted as written, line numbers count "\\n" only, and echoed values are elided."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headscope.data.circuits import load_haystack, load_ioi, load_retrieval
from headscope.data.conllu import read_conllu
from headscope.data.ordinal import load_ordinal
from headscope.data.prompts import load_texts, split_lines
from headscope.errors import HeadscopeError, InputError, elide

NEEDLE = "items:\n- id: n1\n  needle: The code of the red door is {answer}.\n  question: What is the code?\n  answer: {answer}\n"


def _message(load, path: Path) -> str:
    with pytest.raises(HeadscopeError) as info:
        load(path)
    message = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in message and len(message) < 1000
    return message


@pytest.mark.parametrize(
    ("written", "read"), [("010", "8"), ("0755", "493"), ("0x1F", "31"), ("1.50", "1.5")]
)
def test_a_yaml_number_answer_is_quoted_as_written(tmp_path: Path, written: str, read: str) -> None:
    path = tmp_path / "needles.yaml"
    path.write_text(NEEDLE.format(answer=written))
    message = _message(load_retrieval, path)
    assert f'quote it: "{written}"' in message, message
    assert f"YAML read the number {read}" in message or f"read as the number {read}" in message, message


def test_a_plain_number_answer_says_quote_it(tmp_path: Path) -> None:
    path = tmp_path / "needles.yaml"
    path.write_text(NEEDLE.format(answer="123456"))
    assert 'got the number 123456 (quote it: "123456")' in _message(load_retrieval, path)


def test_an_octal_ioi_name_and_ordinal_member_are_quoted_as_written(tmp_path: Path) -> None:
    ioi = tmp_path / "ioi.yaml"
    ioi.write_text("items:\n- text: When 010 and John met, John gave it to\n  io: 010\n  s: John\n")
    assert 'quote it: "010"' in _message(load_ioi, ioi)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  - name: n\n    members: ['001', 010, '011']\n")
    message = _message(load_ordinal, tasks)
    assert 'quote it: "010"' in message and "tasks.yaml:3" in message, message


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85"])
def test_jsonl_with_a_unicode_line_separator_inside_a_string(tmp_path: Path, separator: str) -> None:
    good = {
        "id": "a",
        "text": f"When Mary{separator} and John went out, John gave a book to",
        "io": "Mary",
        "s": "John",
    }
    bad = {"id": "b", "text": "When Ann and John went out, John gave it to", "io": "Bob", "s": "John"}
    path = tmp_path / "ioi.jsonl"
    # ensure_ascii=False writes the separator raw, as an editor would
    path.write_text(json.dumps(good, ensure_ascii=False) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    assert ".jsonl:2: item 'b'" in _message(load_ioi, path)
    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"text": f"a{separator}b"}, ensure_ascii=False) + "\r\n" + '{"text": ""}\r\n')
    assert "texts.jsonl:2:" in _message(load_texts, texts)


def test_jsonl_crlf_and_a_separator_load(tmp_path: Path) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "a\u2028b"}\r\n{"text": "c"}\r\n', encoding="utf-8")
    prompt_set = load_texts(path)
    assert [item.text for item in prompt_set.items] == ["a\u2028b", "c"]
    assert [item.source.rsplit(":", 1)[1] for item in prompt_set.items] == ["1", "2"]


def test_conllu_lines_split_at_newline_only(tmp_path: Path) -> None:
    form = "a\u2028b"
    path = tmp_path / "t.conllu"
    path.write_text(
        f"# text = {form} dog\n1\t{form}\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tdog\t_\t_\t_\t_\t0\troot\t_\t_\n\n"
        "1\tx\t_\t_\t_\t_\t9\tdet\t_\t_\n\n",
        encoding="utf-8",
    )
    with pytest.raises(HeadscopeError) as info:
        read_conllu(path)
    assert "t.conllu:5:" in str(info.value), str(info.value)
    assert read_conllu(path, skip_bad=True).sentences[0].words[0].form == form


def test_haystack_conllu_text_lines(tmp_path: Path) -> None:
    path = tmp_path / "h.conllu"
    path.write_text("".join(f"# text = Sentence {i}\u2028 goes on.\n" for i in range(6)), encoding="utf-8")
    assert len(load_haystack(path)) == 6


def test_split_lines() -> None:
    assert split_lines("a\r\nb\u2028c\n\nd") == ["a", "b\u2028c", "", "d"]
    assert split_lines("a\n") == ["a"]


def test_elide_keeps_messages_one_short_line() -> None:
    assert elide("short") == "short"
    long = elide("x" * 1_000_000)
    assert len(long) < 100 and "chars]" in long
    assert elide("a\nb\rc\u2028d") == "a\\nb\\rc\\u2028d"
    error = InputError("value " + "y" * 1_000_000 + "\nnext line", hint="do this")
    assert len(str(error)) < 1000 and "\n" not in str(error) and str(error).endswith("(do this)")


def test_a_million_byte_field_gives_a_short_line(tmp_path: Path) -> None:
    path = tmp_path / "needles.jsonl"
    huge = "z" * 1_000_000
    path.write_text(
        json.dumps({"needle": f"The code is {huge}.", "question": "Code?", "answer": huge + "!"}) + "\n"
    )
    assert len(_message(load_retrieval, path)) < 400
    ioi = tmp_path / "ioi.jsonl"
    ioi.write_text(json.dumps({"text": "When A and B met, B gave it to", "io": huge, "s": "B"}) + "\n")
    assert len(_message(load_ioi, ioi)) < 400
    keys = tmp_path / "keys.jsonl"
    keys.write_text(json.dumps({"text": "a", huge: 1}) + "\n")
    assert len(_message(load_texts, keys)) < 1000


def test_an_id_yaml_reads_as_a_number_keeps_its_text(tmp_path: Path) -> None:
    path = tmp_path / "texts.yaml"
    path.write_text("items:\n- id: 010\n  text: a\n- id: 8\n  text: b\n")
    assert [item.id for item in load_texts(path).items] == ["010", "8"]  # two ids, not "8" twice
    needles = tmp_path / "needles.yaml"
    needles.write_text(NEEDLE.format(answer="'123'").replace("id: n1", "id: 007"))
    assert load_retrieval(needles).items[0].id == "007"
