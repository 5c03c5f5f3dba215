"""Prompt sets: flat data files validated against one schema, with errors that name file and line.

Formats:

* YAML: a mapping with ``name``, optional ``description`` and ``language``, and ``items``,
  a list of mappings with ``text`` and optional ``id`` and ``lang``;
* JSONL: one JSON object per line with the same item keys;
* plain text (``.txt``): one text per non-empty line.

Later prompt sets (syntax, coreference) add keys to the items; the loader rejects keys it does not
know instead of ignoring them, so a typo never drops an annotation silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from headscope.errors import PromptSetError, elide

TEXT_ITEM_KEYS = {"id", "lang", "text"}


@dataclass(frozen=True)
class TextItem:
    id: str
    text: str
    lang: str | None = None
    source: str = ""  # "file:line", for error messages


@dataclass
class PromptSet:
    name: str
    items: list[TextItem]
    path: str
    description: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


def configs_dir() -> Path:
    """The shipped configs: inside the installed package, or configs/ in a source checkout."""
    packaged = resources.files("headscope") / "configs"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[3] / "configs"
    if checkout.is_dir():
        return checkout
    raise PromptSetError("the shipped prompt sets (configs/) are missing from this installation")


def builtin(name: str) -> Path:
    """Path of a shipped prompt set, e.g. ``builtin("text/natural.yaml")``."""
    path = configs_dir() / name
    if not path.is_file():
        raise PromptSetError(f"shipped prompt set {name} not found under {configs_dir()}")
    return path


def display_path(path: str | Path) -> str:
    """Shipped sets show as ``configs/…``; user files as given."""
    try:
        return "configs/" + Path(path).resolve().relative_to(configs_dir().resolve()).as_posix()
    except (ValueError, PromptSetError):
        return str(path)


class _YamlInt(int):
    """An int read from YAML that keeps its source text: ``010`` reads as 8 (octal), ``0755`` as 493."""

    text: str


class _YamlFloat(float):
    """A float read from YAML that keeps its source text (``1.50``, ``.5``, ``1e3``)."""

    text: str


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that records the 1-based line of every mapping under the key ``__line__``, and
    keeps the source text of numbers so that a message can quote what the user wrote."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping

    def _construct_int(self, node: yaml.ScalarNode) -> int:
        number = _YamlInt(self.construct_yaml_int(node))
        number.text = str(node.value)
        return number

    def _construct_float(self, node: yaml.ScalarNode) -> float:
        number = _YamlFloat(self.construct_yaml_float(node))
        number.text = str(node.value)
        return number


_LineLoader.add_constructor("tag:yaml.org,2002:int", _LineLoader._construct_int)  # type: ignore[arg-type]
_LineLoader.add_constructor("tag:yaml.org,2002:float", _LineLoader._construct_float)  # type: ignore[arg-type]


def describe_value(value: Any) -> str:
    """A value from a data file, for a message that says what was found instead of a string.

    YAML reads unquoted numbers, and ``yes``/``no``/``on``/``off``, as numbers and booleans; a
    leading zero even makes a number octal (``010`` is 8). The message quotes the text as written.
    """
    if isinstance(value, bool):
        return f"{value} (YAML reads yes/no/on/off/true/false as booleans; quote it)"
    if isinstance(value, (int, float)):
        text = elide(getattr(value, "text", str(value)), 40)
        shown = (
            f"the number {value!r}"
            if text == repr(value)
            else f"{text}, which YAML read as the number {value!r}"
        )
        return f'{shown} (quote it: "{text}")'
    if value is None:
        return "nothing (an empty entry)"
    if isinstance(value, str):
        return elide(repr(value))
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def id_as_written(value: Any) -> str:
    """An item's id as written: ``id: 010`` stays "010" (YAML reads the number 8)."""
    return str(getattr(value, "text", value))


def split_lines(text: str) -> list[str]:
    """Lines as a text editor numbers them: split at "\n" (a "\r" before it dropped) and nowhere
    else. ``str.splitlines`` also splits at U+2028/2029, \x0b, \x0c, \x1c-\x1e and \x85, which
    are valid inside a JSON string and would shift every later line number."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs: the non-empty pieces between blank lines, stripped (the format of icl --text and
    describe --eval-text)."""
    return [p.strip() for p in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if p.strip()]


def _read_text(path: Path) -> str:
    if not path.exists():
        raise PromptSetError(f"{path}: file not found")
    if path.is_dir():
        raise PromptSetError(f"{path}: is a directory, expected a prompt-set file")
    raw = path.read_bytes()
    if b"\x00" in raw[:4096]:
        raise PromptSetError(f"{path}: looks like a binary file, expected UTF-8 text")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PromptSetError(
            f"{path}:{line}: not valid UTF-8 ({exc.reason}); re-save the file as UTF-8"
        ) from exc
    if not text.strip():
        raise PromptSetError(f"{path}: file is empty")
    return text


def _item_fields(raw: Any, where: str, index: int, allowed: set[str], shape: str) -> dict[str, Any]:
    """The item's keys without the loader's line marker; rejects non-mappings and unknown keys."""
    if not isinstance(raw, dict):
        raise PromptSetError(f"{where}: item {index} must be {shape}, got {type(raw).__name__}")
    raw = {k: v for k, v in raw.items() if k != "__line__"}
    unknown = set(raw) - allowed
    if unknown:
        raise PromptSetError(
            f"{where}: unknown key(s) {elide(', '.join(sorted(map(str, unknown))))}",
            hint=f"allowed: {', '.join(sorted(allowed))}",
        )
    return raw


def _text_item(raw: Any, where: str, index: int, stem: str) -> TextItem:
    raw = _item_fields(raw, where, index, TEXT_ITEM_KEYS, "a mapping with a 'text' key")
    text = raw.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptSetError(f"{where}: 'text' must be a non-empty string, got {describe_value(text)}")
    lang = raw.get("lang")
    if lang is not None and not isinstance(lang, str):
        raise PromptSetError(f"{where}: 'lang' must be a string, got {describe_value(lang)}")
    return TextItem(id_as_written(raw.get("id", f"{stem}-{index + 1}")), text, lang, where)


def _check_unique(items: list[TextItem]) -> None:
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            raise PromptSetError(f"{item.source}: duplicate id '{elide(item.id)}' (first at {seen[item.id]})")
        seen[item.id] = item.source


def _raw_items(path: Path, text: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """(where, raw item) pairs from YAML or JSONL, plus the YAML header (name, description)."""
    suffix = path.suffix.lower()
    if suffix in {".yaml", ".yml"}:
        try:
            data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise PromptSetError(f"{path}{line}: malformed YAML: {problem}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("items"), list):
            raise PromptSetError(f"{path}: expected a mapping with an 'items' list")
        if not data["items"]:
            raise PromptSetError(f"{path}: 'items' is empty")
        where = [
            f"{path}:{raw.get('__line__', '?') if isinstance(raw, dict) else '?'}" for raw in data["items"]
        ]
        header = {k: v for k, v in data.items() if k not in {"items", "__line__"}}
        return list(zip(where, data["items"], strict=True)), header
    if suffix == ".jsonl":
        items = []
        for lineno, line in enumerate(split_lines(text), start=1):
            if not line.strip():
                continue
            try:
                items.append((f"{path}:{lineno}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise PromptSetError(
                    f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})"
                ) from exc
        return items, {}
    raise PromptSetError(f"{path}: unknown prompt-set format '{suffix}'", hint="use .yaml or .jsonl")


def load_texts(path: str | Path) -> PromptSet:
    """Load a text prompt set from YAML, JSONL or plain text (one text per line)."""
    path = Path(path)
    text = _read_text(path)
    stem = path.stem
    if path.suffix.lower() in {".txt", ""}:
        items = [
            TextItem(f"{stem}-{lineno}", line.strip(), None, f"{path}:{lineno}")
            for lineno, line in enumerate(split_lines(text), start=1)
            if line.strip()
        ]
        result = PromptSet(stem, items, str(path))
    else:
        if path.suffix.lower() not in {".yaml", ".yml", ".jsonl"}:
            raise PromptSetError(
                f"{path}: unknown prompt-set format '{path.suffix}'", hint="use .yaml, .jsonl or .txt"
            )
        raw_items, header = _raw_items(path, text)
        items = [_text_item(raw, where, i, stem) for i, (where, raw) in enumerate(raw_items)]
        result = PromptSet(
            str(header.get("name", stem)), items, str(path), str(header.get("description", "")).strip()
        )
    _check_unique(result.items)
    return result


# --- coreference sets ------------------------------------------------------------------------

COREF_ITEM_KEYS = {"id", "lang", "text", "pronoun", "candidates", "antecedent", "note"}
Span = tuple[int, int]


@dataclass(frozen=True)
class CorefItem:
    id: str
    text: str
    pronoun: Span
    candidates: tuple[Span, ...]
    antecedent: int
    lang: str | None = None
    source: str = ""


@dataclass
class CorefSet:
    name: str
    items: list[CorefItem]
    path: str
    skipped: list[str] = field(default_factory=list)


def _span(value: Any, what: str, where: str, text: str) -> Span:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise PromptSetError(
            f"{where}: {what} must be a [start, end) pair of character offsets, got {elide(value)}"
        )
    start, end = value
    if not 0 <= start < end <= len(text):
        raise PromptSetError(
            f"{where}: {what} [{start}, {end}) is outside the text (length {len(text)}) or empty"
        )
    return (int(start), int(end))  # plain ints, not the loader's number-with-source-text


def _coref_item(raw: Any, where: str, index: int, stem: str) -> CorefItem:
    raw = _item_fields(raw, where, index, COREF_ITEM_KEYS, "a mapping")
    for key in ("text", "pronoun", "candidates", "antecedent"):
        if key not in raw:
            raise PromptSetError(f"{where}: missing '{key}'")
    text = raw["text"]
    if not isinstance(text, str) or not text.strip():
        raise PromptSetError(f"{where}: 'text' must be a non-empty string")
    pronoun = _span(raw["pronoun"], "'pronoun'", where, text)
    candidates = raw["candidates"]
    if not isinstance(candidates, list) or len(candidates) < 2:
        raise PromptSetError(f"{where}: 'candidates' must list at least two spans")
    spans = tuple(_span(c, f"candidate {i}", where, text) for i, c in enumerate(candidates))
    for i, (start, end) in enumerate(spans):
        if start < pronoun[1] and pronoun[0] < end:
            raise PromptSetError(f"{where}: candidate {i} overlaps the pronoun")
    antecedent = raw["antecedent"]
    if not isinstance(antecedent, int) or isinstance(antecedent, bool) or not 0 <= antecedent < len(spans):
        raise PromptSetError(
            f"{where}: 'antecedent' must be an index into 'candidates' (0..{len(spans) - 1}), got {elide(antecedent)}"
        )
    lang = raw.get("lang")
    return CorefItem(
        id_as_written(raw.get("id", f"{stem}-{index + 1}")),
        text,
        pronoun,
        spans,
        int(antecedent),
        lang,
        where,
    )


def load_coref(path: str | Path, *, skip_bad: bool = False) -> CorefSet:
    """Load a coreference set (YAML or JSONL). Bad items raise unless ``skip_bad``."""
    path = Path(path)
    raw_items, header = _raw_items(path, _read_text(path))
    items, skipped = [], []
    for index, (where, raw) in enumerate(raw_items):
        try:
            items.append(_coref_item(raw, where, index, path.stem))
        except PromptSetError as exc:
            if not skip_bad:
                raise
            skipped.append(str(exc))
    if not items:
        raise PromptSetError(f"{path}: no valid items")
    _check_unique(items)  # type: ignore[arg-type]
    return CorefSet(str(header.get("name", path.stem)), items, str(path), skipped)
