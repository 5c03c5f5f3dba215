"""Code that several modules share has one home (issue 38): a LoadedModel is made in one function,
the borrow of a model lives in capture/borrow.py, and its old name is the same object."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "headscope"


def where_called(name: str) -> list[str]:
    """``path:function`` of every call of ``name(...)`` under src/headscope."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    found.append(f"{path.relative_to(PACKAGE).as_posix()}:{function.name}")
    return sorted(set(found))


def where_defined(name: str) -> list[str]:
    return sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if any(
            isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )


def test_a_loaded_model_is_assembled_in_one_function():
    assert where_called("LoadedModel") == ["models/load.py:assemble"]


def test_the_borrow_lives_in_its_own_module():
    for name in ("borrowed", "borrow_lock", "_ModelState"):
        assert where_defined(name) == ["capture/borrow.py"], name
    assert where_defined("prepared") == []


def test_the_old_name_of_the_borrow_is_the_borrow():
    from headscope import capture
    from headscope.capture import borrow, stream

    assert capture.prepared is borrow.borrowed
    assert stream.prepared is borrow.borrowed
    assert capture.borrowed is borrow.borrowed


def test_streaming_capture_declares_its_attention_to_the_borrow():
    from headscope.capture import borrow, stream

    assert borrow._attention("stream") == (stream.STREAM_IMPLEMENTATION, stream.register_streaming_attention)
    assert borrow._attention("eager") == ("eager", None)


def test_a_capture_mode_nobody_declared_is_refused_before_the_model_is_touched():
    from headscope.capture import borrow

    touched = []
    model = SimpleNamespace(set_attn_implementation=touched.append, config=SimpleNamespace())
    loaded = SimpleNamespace(model=model, capture_mode="mystery", owned=False, active=0)
    with pytest.raises(RuntimeError, match="'mystery'"), borrow.borrowed(loaded):
        pass
    assert touched == [] and loaded.active == 0
