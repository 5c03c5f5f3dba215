"""Few-shot in-context-learning (ICL) tasks, in the style of Todd et al. (2024), "Function Vectors".

A task is a list of (input, answer) pairs such as hot -> cold. A few-shot prompt shows some pairs as
demonstrations and ends with the input of another, and the model should continue with its answer::

    Q: hot
    A: cold

    Q: big
    A: small

    Q: fast
    A:                     <- " slow" is due here

A task is a YAML file (the shipped ones are under ``configs/icl/``)::

    # Written for headscope. <one line on what it is>
    name: antonym-en
    lang: en            # en or zh: picks the prompt template
    description: Each word to its antonym.
    pairs:
      - [hot, cold]
      - [big, small]

Errors name file and line, as in :mod:`headscope.data.prompts`. No torch here; :func:`answer_ids`
takes any Hugging Face-style tokenizer object.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.data import yamlines
from headscope.data.prompts import _read_text, configs_dir, describe_value, display_path
from headscope.data.yamlines import key_line as _key_line
from headscope.errors import InputError, PromptSetError, elide, one_line

TASK_KEYS = {"name", "lang", "description", "pairs"}
# A 10-shot prompt needs ten demonstrations and a query, each a different pair.
MIN_PAIRS = 12
_NAME = re.compile(r"^[\w.+-]+$")
_FORMAT_HINT = "see configs/icl/antonym-en.yaml for the format"


@dataclass(frozen=True)
class ICLTemplate:
    """How one pair is written: as a demonstration, as the query, and the answer after the query."""

    demo: str  # with {x} and {y}
    query: str  # with {x}; the answer follows it directly
    answer: str  # with {y}


# One template per ``lang``. The English answer carries its leading space, so the answer is the
# token the model should emit right after "A:"; the Chinese one follows the full-width colon.
TEMPLATES: dict[str, ICLTemplate] = {
    "en": ICLTemplate(demo="Q: {x}\nA: {y}\n\n", query="Q: {x}\nA:", answer=" {y}"),
    "zh": ICLTemplate(demo="问：{x}\n答：{y}\n\n", query="问：{x}\n答：", answer="{y}"),
}


@dataclass(frozen=True)
class ICLPair:
    x: str  # the input
    y: str  # the answer
    line: int  # 1-based line in the task file


@dataclass(frozen=True)
class ICLTask:
    name: str
    lang: str  # a key of TEMPLATES
    description: str
    pairs: tuple[ICLPair, ...]
    path: Path

    @property
    def template(self) -> ICLTemplate:
        return TEMPLATES[self.lang]

    def demo(self, pair: ICLPair) -> str:
        """``pair`` as a demonstration, e.g. "Q: hot\\nA: cold\\n\\n"."""
        return self.template.demo.format(x=pair.x, y=pair.y)

    def query(self, pair: ICLPair) -> str:
        """``pair``'s input as the query, e.g. "Q: hot\\nA:"; the answer follows it directly."""
        return self.template.query.format(x=pair.x)

    def answer(self, pair: ICLPair) -> str:
        """``pair``'s answer as it continues the query, e.g. " cold" (English) or "小" (Chinese)."""
        return self.template.answer.format(y=pair.y)

    def prompt(self, demos: Sequence[ICLPair], query: ICLPair) -> str:
        """The demonstrations in order, then the query: the text the answer should follow."""
        return "".join(self.demo(pair) for pair in demos) + self.query(query)


def _shipped_dir() -> Path:
    try:
        return configs_dir() / "icl"
    except PromptSetError:  # an installation without configs/: no shipped tasks, said when asked
        return Path(__file__).resolve().parents[3] / "configs" / "icl"


SHIPPED_DIR = _shipped_dir()


# --- loading -------------------------------------------------------------------------------------


def _parse(path: Path, shown: str) -> Any:
    return yamlines.parse(_read_text(path), shown, _FORMAT_HINT)


def _header_string(data: dict[str, Any], key: str, shown: str, hint: str) -> str:
    at = f"{shown}:{_key_line(data, key)}"
    if key not in data:
        raise PromptSetError(f"{at}: missing '{key}'", hint=hint)
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        raise PromptSetError(
            f"{at}: '{key}' must be a non-empty string, got {describe_value(value)}", hint=hint
        )
    return value.strip()


def _pair(raw: Any, index: int, line: int, shown: str) -> ICLPair:
    at = f"{shown}:{line}: pair {index + 1}"
    if not isinstance(raw, list) or len(raw) != 2:
        got = f"a list of {len(raw)} item(s)" if isinstance(raw, list) else describe_value(raw)
        raise PromptSetError(
            f"{at} must be a list of two strings [input, answer], got {got}",
            hint="write it as '- [hot, cold]'",
        )
    for value, what in zip(raw, ("input", "answer"), strict=True):
        if not isinstance(value, str) or not value.strip():
            raise PromptSetError(f"{at}: the {what} must be a non-empty string, got {describe_value(value)}")
        if one_line(value) != value:
            raise PromptSetError(
                f"{at}: the {what} ({elide(value)}) contains a line break",
                hint="each input and answer is one line; the template adds the line breaks",
            )
        if value != value.strip():
            raise PromptSetError(
                f"{at}: the {what} ({elide(repr(value))}) starts or ends with whitespace",
                hint="remove it; the template adds the spaces",
            )
    return ICLPair(raw[0], raw[1], line)


def load_task(path: str | Path) -> ICLTask:
    """Load one ICL task (YAML). Errors raise :class:`PromptSetError` naming file and line."""
    path = Path(path)
    shown = display_path(path)
    if path.suffix.lower() not in {".yaml", ".yml"}:
        raise PromptSetError(
            f"{shown}: unknown ICL task format '{path.suffix}'", hint="ICL tasks are YAML (.yaml, .yml)"
        )
    data = _parse(path, shown)
    if not isinstance(data, dict):
        raise PromptSetError(
            f"{shown}:1: expected a mapping with 'name', 'lang', 'description' and 'pairs', "
            f"got {describe_value(data)}",
            hint=_FORMAT_HINT,
        )
    unknown = sorted(map(str, set(yamlines.fields(data)) - TASK_KEYS))
    if unknown:
        raise PromptSetError(
            f"{shown}:{_key_line(data, unknown[0])}: unknown key(s) {elide(', '.join(unknown))}",
            hint=f"allowed: {', '.join(sorted(TASK_KEYS))}",
        )
    name = _header_string(data, "name", shown, "add e.g. 'name: antonym-en'")
    if not _NAME.match(name):
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'name')}: 'name' ({elide(name)}) must be one word "
            "(letters, digits, '.', '_', '+', '-')",
            hint="e.g. 'name: antonym-en'",
        )
    lang = _header_string(data, "lang", shown, f"add 'lang: en' or 'lang: zh' ({_langs()})")
    if lang not in TEMPLATES:
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'lang')}: unknown lang '{elide(lang)}'; expected {_langs()}",
            hint="lang picks the prompt template: 'Q: ... A: ...' (en) or '问：... 答：...' (zh)",
        )
    description = data.get("description", "")
    if not isinstance(description, str):
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'description')}: 'description' must be a string, "
            f"got {describe_value(description)}"
        )
    if "pairs" not in data:
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'pairs')}: missing 'pairs'",
            hint="add 'pairs:' with '- [input, answer]' entries",
        )
    raw_pairs = data["pairs"]
    pairs_line = _key_line(data, "pairs")
    if not isinstance(raw_pairs, list):
        raise PromptSetError(
            f"{shown}:{pairs_line}: 'pairs' must be a list of [input, answer] pairs, "
            f"got {describe_value(raw_pairs)}",
            hint="write 'pairs:' then one '- [hot, cold]' per line",
        )
    lines = getattr(raw_pairs, "lines", None) or [pairs_line] * len(raw_pairs)
    pairs = [_pair(raw, i, line, shown) for i, (raw, line) in enumerate(zip(raw_pairs, lines, strict=True))]
    first: dict[str, ICLPair] = {}
    for index, pair in enumerate(pairs):
        if pair.x in first:
            raise PromptSetError(
                f"{shown}:{pair.line}: pair {index + 1} repeats the input '{elide(pair.x)}' "
                f"of line {first[pair.x].line}",
                hint="each input must occur once, or its answer is ambiguous",
            )
        first[pair.x] = pair
    if len(pairs) < MIN_PAIRS:
        raise PromptSetError(
            f"{shown}:{pairs_line}: task '{elide(name)}' has {len(pairs)} pair(s); at least {MIN_PAIRS} "
            "are needed (a 10-shot prompt takes 10 demonstrations and a query)",
            hint="add more pairs",
        )
    return ICLTask(name, lang, description.strip(), tuple(pairs), path)


def _langs() -> str:
    return " or ".join(sorted(TEMPLATES))


def shipped_task_names() -> list[str]:
    """Names of the shipped tasks (the files under ``configs/icl/``), sorted."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(path.stem for path in SHIPPED_DIR.glob("*.yaml"))


def load_tasks(specs: Sequence[str] | None = None) -> list[ICLTask]:
    """The tasks ``specs`` names, in order: each a shipped task name or a path to a .yaml file.

    None loads every shipped task. Two tasks with the same name are refused (their results would
    share a label).
    """
    shipped = shipped_task_names()
    if specs is None:
        if not shipped:
            raise PromptSetError(f"no shipped ICL tasks found under {SHIPPED_DIR}")
        specs = shipped
    elif isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise InputError(
            "no ICL tasks given", hint=f"name shipped tasks ({', '.join(shipped)}) or .yaml files"
        )
    tasks: list[ICLTask] = []
    seen: dict[str, str] = {}
    for spec in specs:
        if spec in shipped:
            task = load_task(SHIPPED_DIR / f"{spec}.yaml")
        elif Path(spec).suffix.lower() in {".yaml", ".yml"} or Path(spec).exists():
            task = load_task(spec)
        else:
            raise InputError(
                f"unknown ICL task '{elide(spec)}'",
                hint=f"shipped: {', '.join(shipped) or 'none'}; or give the path of a .yaml task file",
            )
        where = display_path(task.path)
        if task.name in seen:
            raise InputError(
                f"two ICL tasks are named '{elide(task.name)}': {seen[task.name]} and {where}",
                hint="give each task once, or rename one",
            )
        seen[task.name] = where
        tasks.append(task)
    return tasks


# --- tokens --------------------------------------------------------------------------------------


def _ids(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def answer_ids(task: ICLTask, tokenizer: Any) -> tuple[dict[int, int], list[ICLPair]]:
    """Each pair's answer token id (by pair index), and the pairs whose answer is not one token.

    The answer is one token when tokenizing query + answer gives the query's tokens plus exactly one
    more (without special tokens): then that token is what the model should predict after the query.
    """
    ids: dict[int, int] = {}
    multi: list[ICLPair] = []
    # An answer the tokenizer reads as its unknown token is no answer (a word-level vocabulary).
    unknown = getattr(tokenizer, "unk_token_id", None)
    for index, pair in enumerate(task.pairs):
        query = _ids(tokenizer, task.query(pair))
        full = _ids(tokenizer, task.query(pair) + task.answer(pair))
        if len(full) == len(query) + 1 and full[: len(query)] == query and full[-1] != unknown:
            ids[index] = full[-1]
        else:
            multi.append(pair)
    return ids, multi
