"""The docs as committed: the CLI reference and the cheap output blocks are current, the site builds
with ``mkdocs build --strict``, and the README stays a front door (scripts/docs.py writes the first two;
``make docs`` regenerates them)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import subprocess
import sys
import warnings

import pytest
from conftest import ROOT, StaleExpensiveOutput, in_ci
from docs_script import load_script

README_LIMIT = 12 * 1024  # bytes: issue 22 asks for a README of at most 12 KB


@pytest.fixture(scope="module")
def docs():
    return load_script()


def test_cli_reference_is_current(docs):
    committed = docs.CLI_PATH.read_text(encoding="utf-8") if docs.CLI_PATH.exists() else ""
    assert committed == docs.cli_reference(), (
        f"{docs.display(docs.CLI_PATH)} is out of date with the Typer app: run make docs "
        "(.venv/bin/python scripts/docs.py cli)"
    )


def test_cli_reference_names_every_command(docs):
    import typer

    from headscope.cli import app

    root = typer.main.get_command(app)
    text = docs.cli_reference()
    for name in root.list_commands(typer.Context(root)):
        assert f"## `headscope {name}`" in text


def test_cheap_output_blocks_are_current(docs):
    """Reruns every cheap block in README.md and docs/ (the toy model: seconds each) and compares."""
    messages: list[str] = []
    outcome = docs.outputs(check=True, log=messages.append)
    problems = outcome.errors + outcome.stale
    # Expensive blocks measured before the code last changed (or never) are reported, not failed:
    # they show in pytest's warnings summary until `make docs-outputs` runs.
    for note in outcome.notes:
        warnings.warn(note, StaleExpensiveOutput, stacklevel=1)
    assert not problems, (
        "\n\n".join(problems) + "\n\nrun make docs (.venv/bin/python scripts/docs.py outputs)"
    )


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        message = "mkdocs is not installed (pip install -e '.[dev]' brings mkdocs-material)"
        if in_ci():
            pytest.fail(message + "; CI must build the docs")
        pytest.skip(message)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"


def test_readme_is_a_front_door():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, (
        f"README.md is {size:,} bytes; keep it under {README_LIMIT:,} and move detail into docs/"
    )


TOY_BLOCK = (
    '<!-- hs:output cmd="headscope info tests/toy/model ;; headscope scan no-such-model ;; '
    'headscope show tests/toy/model --layer 1 --head 1 --text &quot;A B C D A B C D&quot;" exit="0 ;; 2 ;; 0" -->\n'
    "<!-- hs:end -->\n"
)


def _same_on_both_runners(docs, blocks):
    forks = docs.ForkRunner(2, print)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            forked = list(pool.map(forks, blocks))
        assert forks.started and forks.started[0].ready, forks.started[0].why
    finally:
        forks.close()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fresh = list(pool.map(docs.run_block, blocks))
    for fast, slow in zip(forked, fresh, strict=True):
        assert fast.errors == slow.errors
        for a, b in zip(fast.ran, slow.ran, strict=True):
            assert (a.output, a.status) == (b.output, b.status), f"{fast.block.where}: `{a.command}`"


@pytest.mark.slow
def test_forked_and_fresh_processes_agree_on_toy_commands(docs, tmp_path):
    """The fork server's child prints, byte for byte, what `headscope ...` run by bash prints, on a
    block of toy-model commands: a success, a refusal (exit 2) and a view. The same check over every
    cheap block of the docs is run by `make docs-outputs` (a fresh interpreter per command)."""
    page = tmp_path / "page.md"
    page.write_text(TOY_BLOCK)
    _same_on_both_runners(docs, docs.parse(page).blocks)


@pytest.mark.docs_outputs
def test_forked_and_fresh_processes_agree_on_every_cheap_block(docs, tmp_path):
    """The fork server's child prints, byte for byte, what `headscope ...` run by bash prints: on every
    cheap block of the docs that runs a headscope command (so never on nothing). A block of scripts
    alone runs through bash on both runners, so comparing it would prove nothing and cost a fresh
    interpreter per command. Run by `make docs-outputs`, next to regenerating those blocks."""
    blocks = [
        b
        for path in docs.doc_files()
        for b in docs.parse(path).blocks
        if not b.expensive and any(docs.headscope_argv(c) for c in b.commands)
    ]
    assert len(blocks) >= 5, [b.where for b in blocks]
    _same_on_both_runners(docs, blocks)
