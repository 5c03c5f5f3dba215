from __future__ import annotations

from pathlib import Path

import pytest

from headscope.data.prompts import builtin, configs_dir, load_texts
from headscope.errors import PromptSetError


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_shipped_natural_text_has_english_and_chinese():
    prompt_set = load_texts(builtin("text/natural.yaml"))
    langs = {item.lang for item in prompt_set.items}
    assert langs == {"en", "zh"}
    assert sum(item.lang == "zh" for item in prompt_set.items) >= 20
    assert all(item.text.strip() for item in prompt_set.items)


def test_configs_are_found_inside_the_package_or_the_checkout():
    # A wheel carries configs/ inside the package; an editable install or PYTHONPATH=src reads the
    # checkout's. tests/integration/test_wheel.py checks the wheel itself.
    import headscope

    inside = Path(headscope.__file__).parent / "configs"
    checkout = Path(__file__).resolve().parents[2] / "configs"
    assert configs_dir() in {inside, checkout}
    assert (configs_dir() / "text" / "natural.yaml").is_file()


def test_yaml_jsonl_txt(tmp_path):
    yaml_set = load_texts(
        write(tmp_path, "a.yaml", "name: x\nitems:\n  - text: hello\n  - {id: b, text: 你好}\n")
    )
    assert [i.id for i in yaml_set.items] == ["a-1", "b"]
    assert yaml_set.items[1].source.endswith("a.yaml:4")
    jsonl = load_texts(write(tmp_path, "b.jsonl", '{"text": "one"}\n\n{"text": "two", "lang": "en"}\n'))
    assert [i.text for i in jsonl.items] == ["one", "two"]
    txt = load_texts(write(tmp_path, "c.txt", "first line\n\n second \n"))
    assert [i.text for i in txt.items] == ["first line", "second"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.yaml", "", r"empty\.yaml: file is empty"),
        ("ws.txt", "  \n\n", r"ws\.txt: file is empty"),
        ("bad.yaml", "items:\n  - text: [unclosed\n", r"bad\.yaml:\d+: malformed YAML"),
        ("noitems.yaml", "name: x\n", r"expected a mapping with an 'items' list"),
        ("zero.yaml", "items: []\n", r"'items' is empty"),
        ("key.yaml", "items:\n  - text: a\n  - txt: b\n", r"key\.yaml:3: unknown key\(s\) txt"),
        ("blank.yaml", "items:\n  - text: ''\n", r"blank\.yaml:2: 'text' must be a non-empty string"),
        (
            "dup.yaml",
            "items:\n  - {id: a, text: x}\n  - {id: a, text: y}\n",
            r"dup\.yaml:3: duplicate id 'a'",
        ),
        ("bad.jsonl", '{"text": "ok"}\n{"text": \n', r"bad\.jsonl:2: malformed JSON"),
        ("list.jsonl", '["text"]\n', r"list\.jsonl:1: item 0 must be a mapping"),
        ("bin.txt", b"\x00\x01\x02binary", r"binary file"),
        ("latin.txt", "caf\xe9\n".encode("latin-1"), r"latin\.txt:1: not valid UTF-8"),
        ("data.csv", "text\nhello\n", r"unknown prompt-set format '\.csv'"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, name, content, message):
    path = write(tmp_path, name, content)
    with pytest.raises(PromptSetError, match=message):
        load_texts(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(PromptSetError, match="file not found"):
        load_texts(tmp_path / "nope.yaml")
    with pytest.raises(PromptSetError, match="is a directory"):
        load_texts(tmp_path)


COREF_OK = """name: c
items:
  - text: "Mary met John, and she smiled."
    pronoun: [19, 22]
    candidates: [[0, 4], [9, 13]]
    antecedent: 0
"""


def test_coref_set_loads_and_shipped_sets_are_big_enough():
    from headscope.data.prompts import load_coref

    for name in ("coref/en.yaml", "coref/zh.yaml"):
        coref_set = load_coref(builtin(name))
        assert len(coref_set.items) >= 150
        nearest_wrong = sum(
            max((c for c in it.candidates if c[1] <= it.pronoun[0]), key=lambda c: c[1])
            != it.candidates[it.antecedent]
            for it in coref_set.items
        )
        assert nearest_wrong >= len(coref_set.items) // 3
    zh = load_coref(builtin("coref/zh.yaml"))
    demonstrative = [it for it in zh.items if it.text[it.pronoun[0]] == "那"]
    assert demonstrative and any(
        it.text[slice(*it.candidates[it.antecedent])] == "风景画" for it in demonstrative
    )


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (("[19, 22]", "[19, 99]"), r"c\.yaml:3: 'pronoun' \[19, 99\) is outside the text"),
        (("antecedent: 0", "antecedent: 2"), r"'antecedent' must be an index into 'candidates' \(0\.\.1\)"),
        (("[[0, 4], [9, 13]]", "[[0, 4]]"), r"at least two spans"),
        (("[[0, 4], [9, 13]]", "[[0, 4], [18, 20]]"), r"candidate 1 overlaps the pronoun"),
        (("    antecedent: 0\n", ""), r"missing 'antecedent'"),
    ],
)
def test_malformed_coref_sets(tmp_path, replace, message):
    from headscope.data.prompts import load_coref

    bad = COREF_OK.replace(*replace)
    with pytest.raises(PromptSetError, match=message):
        load_coref(write(tmp_path, "c.yaml", bad))
    good = load_coref(write(tmp_path, "ok.yaml", COREF_OK + bad.split("items:\n")[1]), skip_bad=True)
    assert len(good.items) == 1 and len(good.skipped) == 1
