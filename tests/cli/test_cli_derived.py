"""The CLI derives what the API and the analyses declare (issue 38): the sweep's flags are the
sweepable analyses' options, and ``show`` hands its model spec to ``hs.show``, which checks, loads
and profiles."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

import headscope.api as hs
from headscope.analyses import get
from headscope.cli import app
from headscope.errors import InputError
from headscope.sweeps.executors import sweepable


def sweep_params() -> dict:
    command = typer.main.get_command(app).commands["sweep"]  # type: ignore[attr-defined]
    return {param.name: param for param in command.params}


def declared(analysis: str, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(get(analysis).options) if f.name == name)


@pytest.mark.parametrize(
    ("name", "analysis", "flag", "prefix"),
    [
        ("seq_len", "induction", "--seq-len", ""),
        ("n_seqs", "induction", "--batch", ""),
        ("resamples", "scan", "--resamples", ""),
        ("tokens", "weights", "--tokens", "weights: "),
        ("k", "weights", "--k", "weights: "),
    ],
)
def test_the_sweeps_flags_are_the_analyses_options(name, analysis, flag, prefix):
    param = sweep_params()[name]
    field = declared(analysis, name)
    assert param.opts == [flag]
    assert param.default == field.default
    assert param.help == prefix + field.metadata["help"]


def test_the_sweeps_analysis_help_names_every_sweepable_analysis():
    param = sweep_params()["analyses"]
    assert param.opts == ["--analysis"]
    help = param.help
    assert help.startswith("Comma-separated: induction (default), ")
    assert all(name in help for name in sweepable())


def test_show_goes_through_hs_show(toy_dir, monkeypatch):
    calls = []
    real = hs.show

    def spy(model, *args, **kwargs):
        calls.append((model, kwargs))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(hs, "show", spy)
    args = ["show", str(toy_dir), "--layer", "1", "--head", "0", "--text", "t1 t2 t3", "--format", "json"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    ((model, kwargs),) = calls
    assert model == str(toy_dir)  # the spec: hs.show loads it (after checking the text and heads)
    assert (kwargs["layer"], kwargs["heads"], kwargs["text"]) == (1, "0", "t1 t2 t3")
    assert kwargs["device"] == "cpu" and kwargs["dtype"] == "float32" and kwargs["device_map"] is None


def test_hs_show_checks_before_loading_and_reports_the_load(toy_dir):
    seen = []
    with pytest.raises(InputError):
        hs.show(str(toy_dir), text="t1 t2 t3", heads="nope", on_loaded=seen.append)
    assert seen == []
    shown = hs.show(str(toy_dir), text="t1 t2 t3", heads="all", device_map=None, on_loaded=seen.append)
    ((loaded,),) = [seen]
    assert loaded.name == shown.model
    assert shown.weights.shape == (loaded.layout.n_heads, len(shown.labels), len(shown.labels))


def test_show_and_sweep_keywords_are_declared_once():
    """hs.show's and hs.sweep's keywords, and hs.load's and hs.run's load keywords, are the fields of
    the option groups the CLI's flags come from (ShowOptions, Store, Resources, Recompute, LoadOptions),
    with the same defaults."""
    import inspect

    from headscope.models.options import LoadOptions
    from headscope.outputs.views import ShowOptions
    from headscope.sweeps.options import Recompute, Resources, Store

    def defaults(*groups):
        return {f.name: f.default for g in groups for f in dataclasses.fields(g)}

    def keywords(function):
        params = inspect.signature(function).parameters.values()
        return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

    assert defaults(ShowOptions, LoadOptions).items() <= keywords(hs.show).items()
    assert defaults(LoadOptions).items() <= keywords(hs.load).items()
    assert defaults(LoadOptions).items() <= keywords(hs.run).items()
    assert (defaults(Store, Resources, Recompute).items() - {("out", dataclasses.MISSING)}) <= keywords(
        hs.sweep
    ).items()
    show = typer.main.get_command(app).commands["show"]  # type: ignore[attr-defined]
    flags = {param.name: param for param in show.params}
    for field in dataclasses.fields(ShowOptions):
        assert flags[field.name].help == field.metadata["help"]
    assert flags["heads"].opts == ["--head"] and flags["layer"].opts == ["--layer", "-l"]
    for field in dataclasses.fields(Resources):
        assert sweep_params()[field.name].help == field.metadata["help"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        hs.show("never-loaded", colour="red")
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        hs.load("never-loaded", colour="red")


def test_hs_show_without_text_shows_the_commands_text(toy_dir):
    """hs.show's text defaults to headscope show's (declared once, in ShowOptions)."""
    from headscope.outputs.views import DEFAULT_TEXT

    shown = hs.show(str(toy_dir), layer=0)
    assert shown.labels == hs.show(str(toy_dir), text=DEFAULT_TEXT, layer=0).labels
    assert len(shown.labels) > 5
