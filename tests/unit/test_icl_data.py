"""ICL tasks: the shipped files, the prompt templates, the single-token check, and each refusal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headscope.data.icl import (
    MIN_PAIRS,
    SHIPPED_DIR,
    TEMPLATES,
    ICLPair,
    ICLTask,
    answer_ids,
    load_task,
    load_tasks,
    shipped_task_names,
)
from headscope.errors import InputError, PromptSetError

MIN_SHIPPED_PAIRS = 40
# Tasks with Chinese answers: one token each for Gemma 3, but rarely for SmolLM2, where the analysis
# leaves them out (fewer than MIN_PAIRS single-token answers).
GEMMA_ONLY = {"antonym-zh", "capital-zh"}
SHIPPED = {
    "antonym-en",
    "antonym-zh",
    "capital-en",
    "capital-zh",
    "color-en",
    "color-zh",
    "element-zh",
    "language-en",
    "past-en",
    "pinyin-zh",
    "plural-en",
    "zh-en",
}


def _pairs(n: int, start: int = 0) -> str:
    return "".join(f"  - [w{i}, v{i}]\n" for i in range(start, start + n))


def _write(tmp_path: Path, body: str, name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def _good(name: str = "toy", lang: str = "en", n: int = MIN_PAIRS) -> str:
    return f"name: {name}\nlang: {lang}\ndescription: A toy task.\npairs:\n{_pairs(n)}"


def _at(path: Path, line: int) -> str:
    return re.escape(f"{path}:{line}:")


# --- shipped tasks -------------------------------------------------------------------------------


def test_shipped_tasks_load_with_enough_distinct_pairs() -> None:
    names = shipped_task_names()
    assert names == sorted(names)
    tasks = load_tasks(None)
    assert [task.name for task in tasks] == names
    for task in tasks:
        assert task.path == SHIPPED_DIR / f"{task.name}.yaml"
        assert task.lang in TEMPLATES
        assert task.description
        assert len(task.pairs) >= MIN_SHIPPED_PAIRS, task.name
        assert len({pair.x for pair in task.pairs}) == len(task.pairs), task.name
        assert task.path.read_text(encoding="utf-8").startswith("# Written for headscope."), task.name
    assert set(names) == SHIPPED
    assert GEMMA_ONLY <= SHIPPED
    langs = [task.lang for task in tasks]
    assert langs.count("en") >= 6
    assert langs.count("zh") >= 4


def test_shipped_pair_lines_point_at_the_pair() -> None:
    task = load_tasks(["antonym-en"])[0]
    lines = task.path.read_text(encoding="utf-8").split("\n")
    for pair in task.pairs:
        assert lines[pair.line - 1].strip().startswith("- ["), pair
        assert pair.x in lines[pair.line - 1] and pair.y in lines[pair.line - 1], pair
    assert task.pairs[0] == ICLPair("hot", "cold", task.pairs[0].line)


def test_load_tasks_by_name_and_by_path(tmp_path: Path) -> None:
    path = _write(tmp_path, _good("mine"))
    tasks = load_tasks(["zh-en", str(path)])
    assert tasks[0].name == "zh-en" and tasks[0].lang == "zh"
    assert tasks[1].name == "mine" and tasks[1].path == path
    assert [t.name for t in load_tasks("plural-en")] == ["plural-en"]


def test_unknown_task_name_lists_the_shipped_ones() -> None:
    with pytest.raises(InputError, match="unknown ICL task 'no-such-task'") as info:
        load_tasks(["no-such-task"])
    for name in shipped_task_names():
        assert name in str(info.value)


def test_two_tasks_with_the_same_name_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, _good("antonym-en"))
    with pytest.raises(InputError, match="two ICL tasks are named 'antonym-en'.*configs/icl/antonym-en.yaml"):
        load_tasks(["antonym-en", str(path)])
    with pytest.raises(InputError, match="two ICL tasks are named 'past-en'"):
        load_tasks(["past-en", "past-en"])
    with pytest.raises(InputError, match="no ICL tasks given"):
        load_tasks([])


def test_a_missing_yaml_path_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(PromptSetError, match="file not found"):
        load_tasks([str(tmp_path / "missing.yaml")])


# --- templates -----------------------------------------------------------------------------------


def _task(lang: str) -> ICLTask:
    pairs = (ICLPair("hot", "cold", 5), ICLPair("big", "small", 6), ICLPair("fast", "slow", 7))
    return ICLTask("toy", lang, "", pairs, Path("toy.yaml"))


def test_english_prompt_text() -> None:
    task = _task("en")
    hot, big, fast = task.pairs
    assert task.demo(hot) == "Q: hot\nA: cold\n\n"
    assert task.query(fast) == "Q: fast\nA:"
    assert task.answer(fast) == " slow"
    assert task.prompt([hot, big], fast) == "Q: hot\nA: cold\n\nQ: big\nA: small\n\nQ: fast\nA:"
    assert task.prompt([], fast) == "Q: fast\nA:"


def test_chinese_prompt_text() -> None:
    pairs = (ICLPair("大", "小", 5), ICLPair("水", "water", 6))
    task = ICLTask("toy", "zh", "", pairs, Path("toy.yaml"))
    assert task.demo(pairs[0]) == "问：大\n答：小\n\n"
    assert task.query(pairs[1]) == "问：水\n答："
    assert task.answer(pairs[1]) == "water"
    assert task.prompt([pairs[0]], pairs[1]) == "问：大\n答：小\n\n问：水\n答："


# --- answer_ids with a toy tokenizer -------------------------------------------------------------


class _WordTokenizer:
    """Splits into words (with their leading space), newlines and single other characters; a word
    starting with "z" right after a full-width colon joins the colon ("：zoo" is one piece)."""

    _PIECES = re.compile(r"：z[a-z]*| ?[A-Za-z]+|\n|.", re.S)

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        assert add_special_tokens is False
        pieces = self._PIECES.findall(text)
        return {"input_ids": [self.vocab.setdefault(piece, len(self.vocab)) for piece in pieces]}


def test_answer_ids_keeps_single_tokens_and_reports_the_rest() -> None:
    tokenizer = _WordTokenizer()
    pairs = (ICLPair("hot", "cold", 1), ICLPair("ice", "ice cream", 2), ICLPair("big", "small", 3))
    task = ICLTask("toy", "en", "", pairs, Path("toy.yaml"))
    ids, multi = answer_ids(task, tokenizer)
    assert ids == {0: tokenizer.vocab[" cold"], 2: tokenizer.vocab[" small"]}
    assert multi == [pairs[1]]


def test_answer_ids_refuses_answers_that_split_or_merge_with_the_query() -> None:
    tokenizer = _WordTokenizer()
    pairs = (ICLPair("水", "water", 1), ICLPair("火", "fé", 2), ICLPair("动物园", "zoo", 3))
    task = ICLTask("toy", "zh", "", pairs, Path("toy.yaml"))
    ids, multi = answer_ids(task, tokenizer)
    assert ids == {0: tokenizer.vocab["water"]}
    # "fé" is two pieces; "zoo" is one piece but swallows the query's last token "：".
    assert multi == [pairs[1], pairs[2]]
    assert "：zoo" in tokenizer.vocab


# --- refusals ------------------------------------------------------------------------------------


def test_a_good_file_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, _good())
    task = load_task(path)
    assert (task.name, task.lang, task.description, task.path) == ("toy", "en", "A toy task.", path)
    assert task.pairs[0] == ICLPair("w0", "v0", 5)
    assert task.pairs[-1] == ICLPair(f"w{MIN_PAIRS - 1}", f"v{MIN_PAIRS - 1}", 4 + MIN_PAIRS)


def test_unknown_key_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: toy\nlang: en\nlanguage: English\npairs:\n" + _pairs(MIN_PAIRS))
    with pytest.raises(PromptSetError, match=_at(path, 3) + " unknown key.*language.*allowed: description"):
        load_task(path)


@pytest.mark.parametrize("key", ["name", "lang", "pairs"])
def test_missing_key_is_refused(tmp_path: Path, key: str) -> None:
    body = {"name": "name: toy\n", "lang": "lang: en\n", "pairs": "pairs:\n" + _pairs(MIN_PAIRS)}
    path = _write(tmp_path, "".join(text for k, text in body.items() if k != key))
    with pytest.raises(PromptSetError, match=_at(path, 1) + f" missing '{key}'"):
        load_task(path)


def test_unknown_lang_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, _good(lang="fr"))
    with pytest.raises(PromptSetError, match=_at(path, 2) + " unknown lang 'fr'; expected en or zh"):
        load_task(path)


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("[hot]", "must be a list of two strings .* got a list of 1 item"),
        ("[hot, cold, warm]", "must be a list of two strings .* got a list of 3 item"),
        ("hot", "must be a list of two strings .* got 'hot'"),
        ("[hot, '']", "the answer must be a non-empty string"),
        ("[hot, 1]", "the answer must be a non-empty string, got the number 1"),
        ("[yes, no]", "the input must be a non-empty string, got True"),
        ('["hot\\ncold", x]', "the input .* contains a line break"),
        ('[hot, "co\\nld"]', "the answer .* contains a line break"),
        ("[hot, ' cold']", "the answer .* starts or ends with whitespace"),
    ],
)
def test_bad_pair_is_refused_at_its_line(tmp_path: Path, pair: str, message: str) -> None:
    path = _write(tmp_path, f"name: toy\nlang: en\npairs:\n{_pairs(3)}  - {pair}\n{_pairs(MIN_PAIRS, 3)}")
    with pytest.raises(PromptSetError, match=_at(path, 7) + " pair 4:? " + message):
        load_task(path)


def test_duplicate_input_names_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, f"name: toy\nlang: en\npairs:\n{_pairs(MIN_PAIRS)}  - [w2, again]\n")
    line = 4 + MIN_PAIRS
    with pytest.raises(PromptSetError, match=_at(path, line) + " pair 13 repeats the input 'w2' of line 6"):
        load_task(path)


def test_too_few_pairs_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, _good(n=MIN_PAIRS - 1))
    with pytest.raises(
        PromptSetError, match=_at(path, 4) + f" task 'toy' has {MIN_PAIRS - 1} pair.*at least 12"
    ):
        load_task(path)


def test_other_bad_files_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: toy\nlang: en\npairs: [hot, cold\n")
    with pytest.raises(PromptSetError, match=re.escape(str(path)) + r":\d+: malformed YAML"):
        load_task(path)
    path = _write(tmp_path, "- [hot, cold]\n")
    with pytest.raises(PromptSetError, match=_at(path, 1) + " expected a mapping"):
        load_task(path)
    path = _write(tmp_path, "name: toy\nlang: en\npairs: hot\n")
    with pytest.raises(PromptSetError, match=_at(path, 3) + " 'pairs' must be a list"):
        load_task(path)
    path = _write(tmp_path, _good(name="two words").replace("name: two words", "name: 'two words'"))
    with pytest.raises(PromptSetError, match=_at(path, 1) + " 'name' .* must be one word"):
        load_task(path)
    path = _write(tmp_path, _good(), name="task.json")
    with pytest.raises(PromptSetError, match="unknown ICL task format '.json'"):
        load_task(path)


# --- the bundled tokenizers (GGUF tokenizers take seconds to load) -------------------------------


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def bundled(request):
    """(model name, its tokenizer) for each bundled model."""
    from transformers import AutoTokenizer

    from headscope.models.bundled import bundled_file

    path, _ = bundled_file(request.param)
    return request.param, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _one_token_for(model: str, task: ICLTask) -> bool:
    """Whether every answer of ``task`` should be one token for ``model``'s tokenizer."""
    return model == "gemma3-270m" or task.name not in GEMMA_ONLY


@pytest.mark.slow
def test_every_shipped_answer_is_one_token(bundled) -> None:
    model, tokenizer = bundled
    for task in load_tasks(None):
        ids, multi = answer_ids(task, tokenizer)
        if not _one_token_for(model, task):
            # Chinese answers, rarely one SmolLM2 token: too few for the analysis, which leaves it out.
            assert len(ids) < MIN_PAIRS, (model, task.name, len(ids))
            continue
        assert multi == [], (model, task.name, [pair.y for pair in multi])
        assert sorted(ids) == list(range(len(task.pairs)))
        for index, pair in enumerate(task.pairs):
            assert tokenizer.decode([ids[index]]).strip() == pair.y, (model, task.name, pair)


@pytest.mark.slow
def test_answers_stay_one_token_after_demonstrations(bundled) -> None:
    model, tokenizer = bundled

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    for task in load_tasks(None):
        if not _one_token_for(model, task):
            continue
        single, _ = answer_ids(task, tokenizer)
        demos = task.pairs[:3]
        for index, pair in enumerate(task.pairs[3:], start=3):
            prompt = task.prompt(demos, pair)
            assert ids(prompt + task.answer(pair)) == ids(prompt) + [single[index]], (task.name, pair)
