"""Write docs/reference/architectures.md: what headscope does with one tiny random model per transformers family.

    HF_HUB_OFFLINE=1 python scripts/architectures.py            # rewrite docs/reference/architectures.md
    HF_HUB_OFFLINE=1 python scripts/architectures.py --check    # exit 1 if it is out of date
    HF_HUB_OFFLINE=1 python scripts/architectures.py llama gpt2 # print some families' rows only
    HF_HUB_OFFLINE=1 python scripts/architectures.py --expectations  # print families.py's expectations as of now
    HF_HUB_OFFLINE=1 python scripts/architectures.py --write-expectations  # and write them into families.py

The families, their configs and the expected outcomes live in tests/conformance/families.py; the
per-family report (capture, stream = eager, the analyses, the decomposition checks) is computed
there too, the same code the conformance tests run. Takes well under a minute on a laptop CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
_NAME = "headscope_conformance_families"  # the module name tests/conformance/test_families.py uses


def load_families():
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, ROOT / "tests" / "conformance" / "families.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_NAME]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="print these families' rows instead of writing the file")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/reference/architectures.md is out of date"
    )
    parser.add_argument(
        "--expectations",
        action="store_true",
        help="print the expectation tables of families.py as the code behaves now (to paste over them)",
    )
    parser.add_argument(
        "--write-expectations",
        action="store_true",
        help="rewrite the expectation tables of families.py as the code behaves now (review the diff)",
    )
    args = parser.parse_args()
    families = load_families()
    if args.expectations or args.write_expectations:
        if args.families and args.write_expectations:
            parser.error("--write-expectations covers every family; drop the family names")
        reports = [families.report(name) for name in args.families or families.FAMILIES]
        if args.write_expectations:
            families.write_expectations(reports)
            print("rewrote the expectations in tests/conformance/families.py")
        else:
            print(families.expectations_source(reports))
        return 0
    if args.families:
        for name in args.families:
            print(families.row(families.report(name)))
        return 0
    text = families.markdown([families.report(name) for name in families.FAMILIES])
    path = families.DOC_PATH
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            print(f"{path} is out of date: run python scripts/architectures.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path.relative_to(ROOT)} ({len(families.FAMILIES)} families)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
