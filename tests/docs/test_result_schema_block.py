"""docs/reference/outputs.md shows the result's JSON Schema as the code exports it: the committed
block (``id="result-schema"``) is ``headscope.outputs.schema.json_schema()``, printed."""

from __future__ import annotations

import json

from conftest import ROOT
from docs_script import load_script

from headscope.outputs.schema import json_schema

PAGE = ROOT / "docs" / "reference" / "outputs.md"


def test_the_committed_result_schema_block_is_the_exported_schema():
    docs = load_script()
    block = next(b for b in docs.parse(PAGE).blocks if b.id == "result-schema")
    text, _ = docs.stored(block)
    assert text[0] == f"$ {block.cmd}"
    assert "\n".join(text[1:]) == json.dumps(json_schema(), indent=2, ensure_ascii=False), (
        "docs/reference/outputs.md's result schema is out of date: run "
        ".venv/bin/python scripts/docs.py outputs --only result-schema docs/reference/outputs.md"
    )
