"""A document checked against a JSON Schema that headscope publishes, without jsonschema.

jsonschema is a dev tool, not a dependency, and the schemas headscope writes (the atlas's) use a
small part of draft 2020-12: ``type``, ``enum``, ``const``, ``required``, ``properties``,
``additionalProperties``, ``items``, ``minItems``, ``maxItems``, ``minimum``, ``maximum`` and
``oneOf`` (plus the annotations ``description``, ``title``, ``$schema``, ``$id``). :func:`check`
walks exactly those, and refuses a schema that uses any other keyword, so a schema cannot grow a
rule this reader would silently skip. The tests check it agrees with jsonschema.

A number must be finite (the writers put null, never NaN, where there is no value).
"""

from __future__ import annotations

import json
import math
from typing import Any

ANNOTATIONS = frozenset({"description", "title", "$schema", "$id"})
KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "const",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "oneOf",
    }
)


class SchemaProblem(Exception):
    """The first place a document does not fit: its JSON path (``heads[3].explained.value``) and why."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where, self.problem = where, problem


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object of {len(value)} key{'' if len(value) == 1 else 's'}"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    text = (
        json.dumps(value, ensure_ascii=False) if isinstance(value, str | bool | type(None)) else repr(value)
    )
    return text if len(text) <= 60 else text[:60] + "…"


def _is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    raise ValueError(f"schema type {name!r} is not one this reader knows")


def _at(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def check(schema: dict[str, Any], value: Any, where: str = "") -> None:
    """Raise :class:`SchemaProblem` at the first place ``value`` does not fit ``schema``."""
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise ValueError(f"schema keyword(s) {', '.join(sorted(unknown))} are not read by schemacheck")
    here = where or "the document"
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            raise SchemaProblem(here, f"expected {' or '.join(names)}, got {_shown(value)}")
    if "const" in schema and value != schema["const"]:
        raise SchemaProblem(here, f"expected {_shown(schema['const'])}, got {_shown(value)}")
    if "enum" in schema and not any(
        value == option and type(value) is type(option) for option in schema["enum"]
    ):
        shown = ", ".join(_shown(v) for v in schema["enum"])
        raise SchemaProblem(here, f"{_shown(value)} is not one of {shown}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaProblem(here, f"{_shown(value)} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaProblem(here, f"{_shown(value)} is above the maximum {schema['maximum']}")
    if isinstance(value, dict):
        missing = [key for key in schema.get("required", []) if key not in value]
        if missing:
            raise SchemaProblem(here, f"missing {', '.join(repr(k) for k in missing)}")
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                check(properties[key], item, _at(where, key))
            elif schema.get("additionalProperties") is False:
                raise SchemaProblem(_at(where, key), "is not a field this document has")
            elif isinstance(schema.get("additionalProperties"), dict):
                check(schema["additionalProperties"], item, _at(where, key))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise SchemaProblem(here, f"expected at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise SchemaProblem(here, f"expected at most {schema['maxItems']} items, got {len(value)}")
        if "items" in schema:
            for index, item in enumerate(value):
                check(schema["items"], item, _at(where, index))
    if "oneOf" in schema:
        fits = []
        for option in schema["oneOf"]:
            try:
                check(option, value, where)
            except SchemaProblem:
                continue
            fits.append(option)
        if len(fits) != 1:
            raise SchemaProblem(
                here, f"fits {len(fits)} of the {len(schema['oneOf'])} shapes it may take (exactly one)"
            )
