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
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import PromptSetError

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
    checkout = Path(__file__).resolve().parents[2] / "configs"
    if checkout.is_dir():
        return checkout
    raise PromptSetError("the shipped prompt sets (configs/) are missing from this installation")


def builtin(name: str) -> Path:
    """Path of a shipped prompt set, e.g. ``builtin("text/natural.yaml")``."""
    path = configs_dir() / name
    if not path.is_file():
        raise PromptSetError(f"shipped prompt set {name} not found under {configs_dir()}")
    return path


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that records the 1-based line of every mapping under the key ``__line__``."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


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


def _text_item(raw: Any, where: str, index: int, stem: str) -> TextItem:
    if not isinstance(raw, dict):
        raise PromptSetError(
            f"{where}: item {index} must be a mapping with a 'text' key, got {type(raw).__name__}"
        )
    raw = {k: v for k, v in raw.items() if k != "__line__"}
    unknown = set(raw) - TEXT_ITEM_KEYS
    if unknown:
        raise PromptSetError(
            f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}",
            hint=f"allowed: {', '.join(sorted(TEXT_ITEM_KEYS))}",
        )
    text = raw.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptSetError(f"{where}: 'text' must be a non-empty string")
    lang = raw.get("lang")
    if lang is not None and not isinstance(lang, str):
        raise PromptSetError(f"{where}: 'lang' must be a string")
    item_id = raw.get("id", f"{stem}-{index + 1}")
    return TextItem(str(item_id), text, lang, where)


def _check_unique(items: list[TextItem]) -> None:
    seen: dict[str, str] = {}
    for item in items:
        if item.id in seen:
            raise PromptSetError(f"{item.source}: duplicate id '{item.id}' (first at {seen[item.id]})")
        seen[item.id] = item.source


def load_texts(path: str | Path) -> PromptSet:
    """Load a text prompt set from YAML, JSONL or plain text."""
    path = Path(path)
    text = _read_text(path)
    suffix = path.suffix.lower()
    stem = path.stem
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
        items = [
            _text_item(raw, f"{path}:{raw.get('__line__', '?') if isinstance(raw, dict) else '?'}", i, stem)
            for i, raw in enumerate(data["items"])
        ]
        result = PromptSet(
            str(data.get("name", stem)), items, str(path), str(data.get("description", "")).strip()
        )
    elif suffix == ".jsonl":
        items = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptSetError(
                    f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})"
                ) from exc
            items.append(_text_item(raw, f"{path}:{lineno}", len(items), stem))
        result = PromptSet(stem, items, str(path))
    elif suffix in {".txt", ""}:
        items = [
            TextItem(f"{stem}-{lineno}", line.strip(), None, f"{path}:{lineno}")
            for lineno, line in enumerate(text.splitlines(), start=1)
            if line.strip()
        ]
        result = PromptSet(stem, items, str(path))
    else:
        raise PromptSetError(
            f"{path}: unknown prompt-set format '{suffix}'", hint="use .yaml, .jsonl or .txt"
        )
    _check_unique(result.items)
    return result
