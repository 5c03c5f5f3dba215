"""What loading and checking say is held until the run goes on (:mod:`headscope.core.held`).

An ALiBi model (a tiny random Bloom) loads with a warning from headscope's log (it does not route
attention through transformers' AttentionInterface: eager maps), three wrapped lines that used to
sit above qk's one-line refusal of ALiBi, with the model's layout line. Now a refusal is exactly its
one line; a run that goes on (induction) shows the warning and the layout line as before; ``--debug``
holds nothing. The hold itself: Python's warnings and the log, dropped on a refusal, shown in order
when the run goes on, nothing held outside a hold.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from conftest import word_tokenizer
from typer.testing import CliRunner

from headscope.cli import app
from headscope.core import held

runner = CliRunner()
FALLBACK = "does not route attention through AttentionInterface"
LAYOUT = ": 2 layers x 4 query heads (4 KV heads, 1 per group)"


@pytest.fixture(scope="module")
def bloom_dir(tmp_path_factory):
    """A tiny random Bloom (ALiBi), saved with a word-level tokenizer, as a user's folder."""
    from transformers import BloomConfig, BloomForCausalLM

    folder = tmp_path_factory.mktemp("bloom")
    tokenizer = word_tokenizer(64)
    tokenizer.pad_token = "w1"
    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_refusal_after_loading_is_its_one_line(bloom_dir):
    result = runner.invoke(app, ["qk", str(bloom_dir)], catch_exceptions=False)
    assert result.exit_code == 1, result.stderr  # Unsupported: a RunFailure
    assert result.stderr.splitlines() == [
        f"error: qk: {bloom_dir.name} (bloom): ALiBi adds a distance bias to every score that no residual "
        "source writes"
    ]
    assert result.stdout == ""


def test_debug_holds_nothing(bloom_dir):
    result = runner.invoke(app, ["qk", str(bloom_dir), "--debug"], catch_exceptions=False)
    assert result.exit_code == 1
    assert "BloomForCausalLM does not route attention" in result.stderr and LAYOUT in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith(f"error: qk: {bloom_dir.name} (bloom): ALiBi")


def test_a_run_that_goes_on_shows_what_was_held_in_order(bloom_dir):
    args = ["induction", str(bloom_dir), "--seq-len", "8", "--resamples", "0"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stderr.split())  # the log's lines are wrapped
    assert FALLBACK in text and LAYOUT in text
    assert text.index(FALLBACK) < text.index(LAYOUT)  # as they came: the log while loading, then the layout
    assert "induction" in result.stdout


class _Refused(Exception):
    pass


def test_the_hold_drops_on_a_refusal_and_shows_in_order_when_the_run_goes_on():
    log = logging.getLogger("headscope.test_held")
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep()
    root = logging.getLogger("headscope")
    root.addHandler(handler)
    shown: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            previous = warnings.showwarning
            warnings.showwarning = lambda message, *_a, **_k: shown.append(str(message))
            try:
                with pytest.raises(_Refused), held.holding():
                    log.warning("loaded with a fallback")
                    warnings.warn("a library's notice", UserWarning, stacklevel=1)
                    held.show(lambda: shown.append("layout"))
                    raise _Refused
                assert records == [] and shown == []  # dropped with the refusal
                with held.holding():
                    log.warning("loaded with a fallback")
                    warnings.warn("a library's notice", UserWarning, stacklevel=1)
                    held.show(lambda: shown.append("layout"))
                    assert records == [] and shown == []  # held while checking
                    held.go_on()
                    assert records == ["loaded with a fallback"]
                    assert shown == ["a library's notice", "layout"]
                    log.warning("during the run")  # after go_on: at once
                    assert records[-1] == "during the run"
                held.show(lambda: shown.append("outside"))  # no hold: at once
                assert shown[-1] == "outside"
                with held.holding(enabled=False):
                    log.warning("debug")
                    assert records[-1] == "debug"
            finally:
                warnings.showwarning = previous
    finally:
        root.removeHandler(handler)
    assert not handler.filters  # the hold's filter came off with it


def test_shows_refusal_after_loading_is_its_one_line_too():
    """headscope show checks --layer once the model is loaded: the layout line is held, then dropped."""
    from conftest import TOY_DIR

    result = runner.invoke(
        app, ["show", str(TOY_DIR), "--layer", "30", "--text", "hello"], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --layer 30 is out of range: this model has layers 0..1"
    ]
    shown = runner.invoke(
        app, ["show", str(TOY_DIR), "--layer", "1", "--text", "a b c"], catch_exceptions=False
    )
    assert shown.exit_code == 0 and "2 layers x 4 query heads" in shown.stderr
