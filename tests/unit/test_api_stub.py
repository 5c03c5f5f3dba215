"""The names ``import headscope`` offers come from the registry, and the stub that shows editors
their keywords is current (as the CLI reference is: scripts/docs.py writes both)."""

from __future__ import annotations

import ast
import dataclasses

from conftest import ROOT

import headscope
from headscope import api
from headscope.api.stub import api_stub
from headscope.extend.protocol import ANALYSES

STUB = ROOT / "src" / "headscope" / "__init__.pyi"


def test_stub_is_current():
    assert STUB.read_text(encoding="utf-8") == api_stub(), (
        "src/headscope/__init__.pyi is out of date: run make docs (scripts/docs.py stub)"
    )


def test_stub_gives_every_option_of_every_analysis_as_a_keyword():
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    for name, analysis in ANALYSES.builtins().items():
        node = functions[name.replace("-", "_")]
        declared = {a.arg for a in node.args.args + node.args.kwonlyargs}
        assert {f.name for f in dataclasses.fields(analysis.options)} <= declared, name


def test_root_names_are_the_apis():
    """headscope's names are the API's: its extension names, and one function per analysis."""
    analyses = {name.replace("-", "_") for name in ANALYSES.builtins()}
    assert set(headscope.__all__) == {*headscope._ROOT, *headscope._API, *analyses}
    assert set(headscope._API) | analyses <= set(api.__all__)
    assert "detect" in dir(headscope) and "kv_plan" in dir(headscope)
    for name in headscope.__all__:
        assert getattr(headscope, name) is not None
