"""One run path: the API, the CLI and the sweep all go through ``extend.protocol.execute``, so a
model whose attention maps headscope cannot reproduce is refused the same way from each entry
(before this, the sweep skipped the conformance check and failed later with another message)."""

from __future__ import annotations

import pytest
from conftest import ROOT, load_module
from typer.testing import CliRunner

import headscope as hs
from headscope.cli import app
from headscope.errors import HeadscopeError


@pytest.fixture(scope="module")
def diffllama_folder(tmp_path_factory):
    """A tiny random DiffLlama saved as a model folder: differential attention, whose per-head maps
    do not reproduce the model's output (headscope's conformance check refuses it)."""
    families = load_module(ROOT / "tests" / "conformance" / "families.py", "headscope_conformance_families")
    model, tokenizer = families.build("diffllama")
    folder = tmp_path_factory.mktemp("diffllama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_sweep_gets_exactly_the_refusal_a_direct_run_gets(diffllama_folder, tmp_path):
    with pytest.raises(HeadscopeError) as direct:
        hs.induction(str(diffllama_folder), resamples=0)
    first_line = str(direct.value).splitlines()[0]
    assert "differential attention" in first_line
    cli = CliRunner().invoke(app, ["induction", str(diffllama_folder), "--resamples", "0"])
    assert cli.exit_code == direct.value.exit_code and " ".join(first_line.split())[:80] in " ".join(
        cli.output.split()
    )
    swept = hs.sweep([str(diffllama_folder)], tmp_path / "store", analyses="induction", resamples=0)
    (error,) = swept.failed.values()
    assert error == first_line
