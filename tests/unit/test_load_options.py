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
    assert hs.run("induction", toy, seq_len=16, n_seqs=4, resamples=0).profile is None
