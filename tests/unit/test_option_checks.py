"""Options are checked once, in one place, whatever the entry; what the layout decides is refused
right after loading, before the first forward pass; a refusal names the option as the caller
wrote it (``verify_k=5`` from Python, ``--verify-k 5`` from the command line)."""

from __future__ import annotations

import math

import pytest
from conftest import TOY_DIR
from typer.testing import CliRunner

import headscope as hs
from headscope.analyses.scan import ScanOptions
from headscope.cli import app
from headscope.errors import InputError


class Forwarded(Exception):
    """Raised by a hook on the model: a forward pass happened."""


@pytest.fixture()
def guarded():
    """The toy with a hook that fails the test on any forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    handle = model.register_forward_pre_hook(lambda *args: (_ for _ in ()).throw(Forwarded()))
    yield model, AutoTokenizer.from_pretrained(TOY_DIR)
    handle.remove()


@pytest.mark.parametrize(
    ("function", "options", "message"),
    [
        ("scan", dict(verify=True, verify_k=5), r"verify_k=5 leaves too few heads .* has 8 heads"),
        ("induction", dict(ablate=5), r"ablate=5 leaves too few heads"),
        ("induction", dict(seq_len=100, repeat_seq=2), r"seq_len=100 x repeat_seq=2 is 201 tokens"),
        ("scan", dict(seq_len=100), r"seq_len=100 x repeat_seq=2 is 201 tokens"),
    ],
)
def test_what_the_layout_decides_is_refused_before_any_forward_pass(guarded, function, options, message):
    model, tokenizer = guarded
    with pytest.raises(InputError, match=message):
        getattr(hs, function)(model, tokenizer, resamples=0, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(role_threshold=math.nan), "role_threshold=nan: must be a finite number"),
        (dict(role_margin=math.inf), "role_margin=inf: must be a finite number"),
        (dict(alpha=-math.inf), "alpha=-inf: must be a finite number"),
        (dict(seed=2**70), "a seed must be between 0 and 2\\*\\*63 - 1"),
        (dict(seed=-1), "a seed must be between 0"),
        (dict(seq_len=1), "seq_len=1: must be at least 2"),
        (dict(resamples=50), "^resamples=50 is too few"),  # the keyword, not "--resamples"
        (dict(weights=True, detectors="induction"), "weights=True asks for the weight-only roles"),
    ],
)
def test_python_refusals_name_the_keyword(options, message):
    with pytest.raises(InputError, match=message):
        hs.plan("scan", **options)


def test_a_hand_built_options_dataclass_is_checked_too():
    with pytest.raises(InputError, match="role_threshold=nan"):
        hs.plan_options("scan", ScanOptions(role_threshold=math.nan))


def test_empty_detectors_means_all_from_python_as_from_the_cli():
    assert hs.plan("scan", detectors="")[1].names is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scan", str(TOY_DIR), "--verify", "--verify-k", "5"], "--verify-k 5 leaves too few heads"),
        (
            ["scan", str(TOY_DIR), "--weights", "--detectors", "induction"],
            "--weights asks for the weight-only",
        ),
        (["scan", str(TOY_DIR), "--role-threshold", "nan"], "must be a finite number"),
    ],
)
def test_cli_refusals_name_the_flag(args, message):
    done = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert done.exit_code == 2
    assert message in " ".join(done.output.split())
    assert "Traceback" not in done.output


def test_sweep_png_without_checkpoints_is_refused_before_the_first_run(tmp_path):
    store = tmp_path / "store"
    done = CliRunner().invoke(
        app, ["sweep", str(TOY_DIR), "--out", str(store), "--png", str(tmp_path / "p.png")]
    )
    assert done.exit_code == 2 and "no series of two or more checkpoints" in " ".join(done.output.split())
    assert not store.exists()
