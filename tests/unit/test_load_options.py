"""Load options declared once (models.options.LoadOptions), and hs.run's cost ledger (issue 38)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import headscope as hs
from headscope.api import LOAD_PARAMETERS
from headscope.errors import InputError
from headscope.models.options import LoadOptions, spec_default


def test_api_reads_the_load_options():
    """hs.load, hs.run and every analysis function take the same names, with the same defaults."""
    declared = {f.name: f.default for f in dataclasses.fields(LoadOptions)}
    assert {n: d for n, d, _ in LOAD_PARAMETERS if n in declared} == declared
    for function in (hs.load, hs.run, hs.scan, hs.induction):
        params = inspect.signature(function).parameters
        assert {n: params[n].default for n in declared} == declared, function


def test_cli_groups_read_the_load_options():
    """--device, --dtype, --capture and --device-map: LoadOptions' help texts and choices, at the
    defaults a spec loads with."""
    from headscope.cli import common

    fields = {f.name: f for f in dataclasses.fields(LoadOptions)}
    for group in (common.Device, common.Where, common.Load, common.Capture):
        for f in dataclasses.fields(group):
            if f.name in fields:
                assert f.metadata["help"] == fields[f.name].metadata["help"]
                assert f.metadata["choices"] == fields[f.name].metadata["choices"]
                assert f.default == spec_default(f.name)
    assert [f.name for f in dataclasses.fields(common.Load)] == ["device", "dtype", "device_map", "profile"]
    assert LoadOptions.from_groups(common.Load(), common.Capture()) == LoadOptions(
        device="cpu", dtype="float32"
    )


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"device": "gpu"}, "device must be one of auto, cpu, cuda, mps, got 'gpu'"),
        ({"dtype": "int8"}, "dtype must be one of float32, bfloat16, float16, got 'int8'"),
        ({"capture": "fast"}, "capture must be one of auto, stream, eager, got 'fast'"),
    ],
)
def test_load_refuses_a_value_outside_the_choices(given, needle):
    with pytest.raises(InputError, match=needle):
        hs.load("toy-that-is-never-loaded", **given)


def test_spec_defaults():
    assert LoadOptions().for_spec() == {
        "device": "cpu",
        "dtype": "float32",
        "capture": "auto",
        "device_map": None,
        "revision": None,
    }
    assert LoadOptions(device="cpu", capture="eager").given() == ["device", "capture"]


def test_run_profile_returns_the_cost_ledger(toy):
    result = hs.run("induction", toy, profile=True, seq_len=16, n_seqs=4, resamples=0)
    profile = result.profile
    assert profile is not None
    assert [cost.part for cost in profile.costs][-1] == "run"
    run = profile.costs[-1]
    assert run.seconds > 0 and run.passes > 0 and run.tokens > 0
    assert run.bare_seconds is not None and run.bare_seconds > 0 and run.ratio > 0
    assert profile.to_json()["parts"][-1]["passes"] == run.passes
    # induction reads next-token losses: its bare forward includes the LM head at every position.
    assert 0 < run.head_seconds < run.bare_seconds and run.ratio_base > run.ratio
    assert hs.run("induction", toy, seq_len=16, n_seqs=4, resamples=0).profile is None


def test_the_lm_head_is_priced_only_for_passes_that_read_losses(toy):
    from headscope import analyses, capture
    from headscope.capture import ledger

    sequences, specials, _ = analyses.repeated_tokens(toy, analyses.RepeatSpec(seq_len=20, n_seqs=4))
    batches = analyses.model_batches(toy, sequences, specials, 2)
    attention = capture.Attention(lambda *_: None)
    with ledger.recording() as book:
        with ledger.part("weights"):
            capture.run(toy, batches, capture.Pass(reads=[attention]))
        with ledger.part("losses"):
            capture.run(toy, batches, capture.Pass(reads=[attention, capture.TokenLosses(lambda *_: None)]))
    weights, losses = book.costs(toy, {"weights": 1.0, "losses": 1.0})
    assert weights.head_seconds == 0 and weights.ratio == weights.ratio_base
    assert losses.bare_seconds > weights.bare_seconds
    # The head's share is its measured seconds per position times the passes' positions.
    positions = sum(batch.input_ids.numel() for batch in batches)
    assert losses.head_seconds == pytest.approx(book.head_rate * positions, rel=1e-9)
    assert losses.bare_seconds - losses.head_seconds == pytest.approx(weights.bare_seconds, rel=1e-9)
