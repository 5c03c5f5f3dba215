"""scripts/docs.py, imported once as a module for the tests here (``docs`` fixture in each test file)."""

from __future__ import annotations

from pathlib import Path

from conftest import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docs.py"
_NAME = "headscope_docs_script"


def load_script():
    return load_module(SCRIPT, _NAME)
