"""scripts/docs.py, imported once as a module for the tests here (``docs`` fixture in each test file)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "docs.py"
_NAME = "headscope_docs_script"


def load_script():
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[_NAME]
