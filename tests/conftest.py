"""Shared fixtures. Models load once per session, never at import time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
TOY_DIR = ROOT / "tests" / "toy" / "model"
TOY_TEXTS = ROOT / "tests" / "toy" / "symbols.txt"
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def toy_truth() -> dict:
    return json.loads((TOY_DIR / "ground_truth.json").read_text())


@pytest.fixture(scope="session")
def toy():
    from headscope.models import load

    return load(str(TOY_DIR))


@pytest.fixture(scope="session")
def toy_eager():
    from headscope.models import load

    return load(str(TOY_DIR), capture="eager")


@pytest.fixture(scope="session")
def smollm2():
    from headscope.models import load

    return load("smollm2-135m")


@pytest.fixture(scope="session")
def minilm():
    from headscope.models import load

    return load("minilm-l6")


@pytest.fixture(scope="session")
def toy_texts() -> Path:
    """Random symbol texts in the toy's vocabulary (natural text would be all <unk>)."""
    return TOY_TEXTS


@pytest.fixture(scope="session")
def toy_dir() -> Path:
    return TOY_DIR
