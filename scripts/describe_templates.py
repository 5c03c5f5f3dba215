"""The template library of ``headscope describe`` (default), or the atlas' JSON Schema (``--schema``),
for docs/analyses/describe.md and docs/reference/outputs.md: generated, never pasted."""

from __future__ import annotations

import json
import sys

from headscope.analyses.describe.atlas import json_schema
from headscope.analyses.describe.templates import TEMPLATES


def main() -> None:
    if sys.argv[1:] == ["--schema"]:
        print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
        return
    width = max(len(name) for name in TEMPLATES)
    print(f"{'template':<{width}}  {'kind':<9}  targets at query q")
    for template in TEMPLATES.values():
        where = " (encoders)" if template.encoder_only else ""
        print(f"{template.name:<{width}}  {template.kind:<9}  {template.summary}{where}")


if __name__ == "__main__":
    main()
