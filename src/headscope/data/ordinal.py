"""Ordinal sets for successor heads: ordered sequences such as Monday..Sunday, 1..20 or 甲..癸.

Successor heads (Gould et al. 2023) map an ordinal token to the next one in its sequence:
Monday -> Tuesday, 3 -> 4, 一 -> 二. A set is a YAML file::

    name: ordinal-en
    description: '...'
    lang: en            # optional; guessed from the members when absent
    tasks:
      - name: weekdays
        members: [Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday]

Members are in order: the successor of member ``i`` is member ``i + 1``, and the last member has
none (no wrap-around). Errors name file and line, as in :mod:`headscope.data.prompts`.

No torch and no tokenizer here: which members are one token is resolved per model by
:mod:`headscope.weightroles.tasks`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.data import yamlines
from headscope.data.prompts import _read_text, describe_value, display_path
from headscope.data.yamlines import fields as _fields
from headscope.data.yamlines import key_line as _key_line
from headscope.errors import PromptSetError, elide

SET_KEYS = {"name", "description", "lang", "tasks"}
TASK_KEYS = {"name", "members"}
MIN_MEMBERS = 3

# CJK ideographs (unified, extension A, compatibility): a member containing one makes a set "zh".
_CJK_CHAR = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class OrdinalTask:
    name: str
    members: tuple[str, ...]
    where: str  # "path:line" of the task, for error messages

    def successor(self, member: str) -> str | None:
        """The member after ``member``, or None for the last one."""
        index = self.members.index(member)
        return self.members[index + 1] if index + 1 < len(self.members) else None


@dataclass
class OrdinalSet:
    name: str
    description: str
    path: Path
    lang: str  # the file's top-level ``lang``; else "zh" if any member has CJK characters, else "en"
    tasks: list[OrdinalTask]

    def task(self, name: str) -> OrdinalTask:
        """The task called ``name``; KeyError naming the known tasks otherwise."""
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(f"no task '{name}' in {self.name}; known: {', '.join(t.name for t in self.tasks)}")


def _parse(path: Path, text: str) -> Any:
    return yamlines.parse(text, display_path(path), "see configs/ordinal/en.yaml for the format")


def _check_keys(raw: dict[str, Any], allowed: set[str], shown: str, what: str) -> None:
    unknown = sorted(map(str, set(_fields(raw)) - allowed))
    if unknown:
        raise PromptSetError(
            f"{shown}:{_key_line(raw, unknown[0])}: unknown key(s) {', '.join(unknown)} in {what}",
            hint=f"allowed: {', '.join(sorted(allowed))}",
        )


_describe = describe_value


def _members(raw: dict[str, Any], name: str, shown: str, where: str) -> tuple[str, ...]:
    if "members" not in raw:
        raise PromptSetError(
            f"{where}: task '{name}' has no 'members'",
            hint="add 'members: [first, second, third, ...]' in order",
        )
    members = raw["members"]
    if not isinstance(members, list):
        raise PromptSetError(
            f"{shown}:{_key_line(raw, 'members')}: task '{name}': 'members' must be a list of strings, "
            f"got {_describe(members)}",
            hint="write members: [first, second, third, ...] in order",
        )
    lines = getattr(members, "lines", None) or [_key_line(raw, "members")] * len(members)
    first_seen: dict[str, int] = {}
    for index, (member, line) in enumerate(zip(members, lines, strict=True)):
        at = f"{shown}:{line}: task '{name}'"
        if not isinstance(member, str):
            raise PromptSetError(
                f"{at}: member {index + 1} must be a non-empty string, got {_describe(member)}"
            )
        if not member.strip():
            raise PromptSetError(f"{at}: member {index + 1} is empty", hint="remove it or fill it in")
        if member != member.strip():
            raise PromptSetError(
                f"{at}: member {index + 1} ({elide(repr(member))}) starts or ends with whitespace",
                hint="remove it; the spaced form adds the leading space itself",
            )
        if member in first_seen:
            raise PromptSetError(
                f"{at}: member {index + 1} ({elide(repr(member))}) repeats member {first_seen[member] + 1}",
                hint="each member must occur once, or its successor is ambiguous",
            )
        first_seen[member] = index
    if len(members) < MIN_MEMBERS:
        raise PromptSetError(
            f"{shown}:{_key_line(raw, 'members')}: task '{name}' has {len(members)} member(s); "
            f"at least {MIN_MEMBERS} are needed",
            hint="list the whole sequence in order",
        )
    return tuple(members)


def _task(raw: Any, index: int, shown: str, line: int, seen: dict[str, str]) -> OrdinalTask:
    where = f"{shown}:{line}"
    if not isinstance(raw, dict):
        raise PromptSetError(
            f"{where}: task {index + 1} must be a mapping with 'name' and 'members', got {_describe(raw)}",
            hint="write '- name: weekdays' and 'members: [Monday, Tuesday, ...]'",
        )
    where = f"{shown}:{raw.get('__line__', line)}"
    _check_keys(raw, TASK_KEYS, shown, f"task {index + 1}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        got = "missing" if "name" not in raw else f"got {_describe(name)}"
        raise PromptSetError(
            f"{where}: task {index + 1} needs a non-empty string 'name' ({got})",
            hint="add e.g. 'name: weekdays'",
        )
    name = name.strip()
    if name in seen:
        raise PromptSetError(
            f"{where}: duplicate task name '{elide(name)}' (first at {seen[name]})", hint="rename one of them"
        )
    seen[name] = where
    return OrdinalTask(name, _members(raw, elide(name), shown, where), where)


def guess_lang(tasks: list[OrdinalTask]) -> str:
    """ "zh" if any member contains a CJK ideograph, else "en"."""
    return "zh" if any(_CJK_CHAR.search(m) for task in tasks for m in task.members) else "en"


def load_ordinal(path: str | Path) -> OrdinalSet:
    """Load an ordinal set (YAML). Errors raise :class:`PromptSetError` naming file and line."""
    path = Path(path)
    text = _read_text(path)
    shown = display_path(path)
    if path.suffix.lower() not in {".yaml", ".yml"}:
        raise PromptSetError(
            f"{shown}: unknown ordinal-set format '{path.suffix}'", hint="ordinal sets are YAML (.yaml, .yml)"
        )
    data = _parse(path, text)
    if not isinstance(data, dict):
        raise PromptSetError(
            f"{shown}:1: expected a mapping with 'name', 'description' and a 'tasks' list, "
            f"got {_describe(data)}",
            hint="see configs/ordinal/en.yaml for the format",
        )
    _check_keys(data, SET_KEYS, shown, "the set")
    for key in ("name", "description", "lang"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise PromptSetError(
                f"{shown}:{_key_line(data, key)}: '{key}' must be a string, got {_describe(value)}"
            )
    lang = data.get("lang")
    if lang is not None and not lang.strip():
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'lang')}: 'lang' is empty", hint="write e.g. 'lang: en', or drop it"
        )
    tasks_raw = data.get("tasks")
    if not isinstance(tasks_raw, list):
        got = "no 'tasks'" if "tasks" not in data else f"'tasks' is {_describe(tasks_raw)}"
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'tasks')}: expected a 'tasks' list, {got}",
            hint="add 'tasks:' with '- name: ...' and 'members: [...]' entries",
        )
    if not tasks_raw:
        raise PromptSetError(
            f"{shown}:{_key_line(data, 'tasks')}: 'tasks' is empty", hint="list at least one task"
        )
    lines = getattr(tasks_raw, "lines", None) or [_key_line(data, "tasks")] * len(tasks_raw)
    seen: dict[str, str] = {}
    tasks = [_task(raw, i, shown, lines[i], seen) for i, raw in enumerate(tasks_raw)]
    return OrdinalSet(
        name=str(data.get("name") or path.stem).strip(),
        description=str(data.get("description") or "").strip(),
        path=path,
        lang=lang.strip() if lang is not None else guess_lang(tasks),
        tasks=tasks,
    )
