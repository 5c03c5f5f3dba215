"""A YAML loader that remembers lines, for data files whose errors name file and line (ICL tasks,
ordinal sets).

On top of :class:`headscope.data.prompts._LineLoader` (each mapping's own line under ``__line__``),
:class:`KeyLineLoader` records the line of every mapping key (under ``__key_lines__``) and of every
sequence element (a :class:`LinedList`'s ``lines``), so that a message can point at the very key or
list item that is wrong.
"""

from __future__ import annotations

from typing import Any

import yaml

from headscope.data.prompts import _LineLoader
from headscope.errors import PromptSetError

KEY_LINES = "__key_lines__"
# The bookkeeping keys every loaded mapping carries besides the file's own keys.
HIDDEN_KEYS = frozenset({"__line__", KEY_LINES})


class LinedList(list):  # type: ignore[type-arg]
    """A YAML sequence that remembers the 1-based line of each element in ``lines``."""

    lines: list[int]


class KeyLineLoader(_LineLoader):
    """``_LineLoader`` that also records the line of every mapping key and sequence element."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        mapping[KEY_LINES] = {
            key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)
        }
        return mapping

    def _construct_lined_seq(self, node: yaml.SequenceNode) -> Any:
        data = LinedList()
        data.lines = [child.start_mark.line + 1 for child in node.value]
        yield data
        data.extend(self.construct_sequence(node))


KeyLineLoader.add_constructor(
    "tag:yaml.org,2002:seq",
    KeyLineLoader._construct_lined_seq,  # type: ignore[arg-type]
)


def key_line(raw: dict[str, Any], key: str) -> int:
    """The 1-based line of ``key`` in the mapping ``raw`` (the mapping's own line when absent)."""
    return int(raw.get(KEY_LINES, {}).get(key, raw.get("__line__", 1)))


def fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The mapping's own keys, without the line bookkeeping."""
    return {k: v for k, v in raw.items() if k not in HIDDEN_KEYS}


def parse(text: str, shown: str, format_hint: str) -> Any:
    """``text`` loaded with :class:`KeyLineLoader`; malformed YAML raises :class:`PromptSetError`
    naming ``shown`` and the line, with "fix the YAML syntax; <format_hint>"."""
    try:
        return yaml.load(text, Loader=KeyLineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PromptSetError(
            f"{shown}:{line}: malformed YAML: {problem}", hint=f"fix the YAML syntax; {format_hint}"
        ) from exc
