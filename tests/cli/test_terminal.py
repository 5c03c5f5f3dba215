"""The command line's printing and writing live below it (headscope.outputs.terminal, issue 38): a
script that runs an analysis through the API and prints it with them gets what the command gives."""

from __future__ import annotations

from typer.testing import CliRunner

import headscope as hs
from headscope.cli import app
from headscope.outputs.sweeps import print_interrupted
from headscope.outputs.terminal import Emit, print_result

FAST = {"seq_len": 16, "n_seqs": 4, "resamples": 0}


def test_a_script_prints_a_result_as_the_command_does(toy_dir, tmp_path):
    by_command = tmp_path / "command.json"
    args = ["induction", str(toy_dir), "--seq-len", "16", "--batch", "4", "--resamples", "0"]
    done = CliRunner().invoke(
        app, [*args, "--format", "json", "-o", str(by_command), "--csv", str(tmp_path / "a.csv")]
    )
    assert done.exit_code == 0, done.output
    result = hs.induction(str(toy_dir), **FAST)
    by_script = tmp_path / "script.json"
    print_result("induction", result, Emit(fmt="json", output=str(by_script)), csv=tmp_path / "b.csv")
    assert by_script.read_text() == by_command.read_text()
    assert (tmp_path / "b.csv").read_text() == (tmp_path / "a.csv").read_text()


def test_an_interrupted_sweep_says_what_the_store_keeps(capsys, tmp_path):
    from headscope.sweeps.run import SweepInterrupted

    print_interrupted(KeyboardInterrupt(), tmp_path)
    print_interrupted(SweepInterrupted(tmp_path, 1, 2, 3), tmp_path)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        f"interrupted: the runs finished so far are kept in the store {tmp_path}; run the same sweep "
        "again to compute the rest"
    )
    assert lines[1].startswith("interrupted: 3 finished runs kept in the store")
