"""The CLI is a thin user of the API (issue 38): compare goes through hs.compare, --profile prints
the ledger that hs.run returns."""

from __future__ import annotations

from typer.testing import CliRunner

import headscope.api as hs
from headscope.capture import ledger
from headscope.cli import app

HEADER = "model,detector,relation,direction,layer,head,score\n"


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_compare_goes_through_hs_compare(tmp_path, monkeypatch):
    rows = "".join(
        f"m,induction,,,{layer},{head},0.{layer}{head}\n" for layer in range(2) for head in range(2)
    )
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text(HEADER + rows)
    calls = []
    real = hs.compare

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hs, "compare", spy)
    done = invoke("compare", tmp_path / "a.csv", tmp_path / "b.csv", "--format", "json")
    assert done.exit_code == 0, done.output
    assert calls == [(tmp_path / "a.csv", tmp_path / "b.csv")]


def test_profile_prints_the_ledger_hs_run_returns(toy_dir, monkeypatch):
    made = []
    real = ledger.Ledger.profile

    def spy(self, *args, **kwargs):
        made.append(real(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ledger.Ledger, "profile", spy)
    done = invoke("induction", toy_dir, "--seq-len", "16", "--batch", "4", "--resamples", "0", "--profile")
    assert done.exit_code == 0, done.output
    (profile,) = made
    (line,) = [line for line in done.output.splitlines() if line.startswith("profile: ")]
    run = profile.costs[-1]
    assert f"run {run.seconds:.1f} s ({run.ratio:.2f}× bare, {run.passes} passes)" in line
