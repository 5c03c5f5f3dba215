"""`headscope … | head -1`: a reader that goes away ends every command quietly, with the status a
shell gives a process killed by SIGPIPE (141 = 128 + 13) and no error on stderr (issue 23)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headscope.outputs.terminal import BROKEN_PIPE_EXIT

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "toy" / "model"


def run_with_closed_stdout(*args: str) -> tuple[int, str]:
    """Run the CLI with a stdout pipe whose reader is already gone when the child writes."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    child = subprocess.Popen(
        [sys.executable, "-m", "headscope.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader closes before the first byte is written
    stderr = child.stderr.read().decode("utf-8", "replace")
    return child.wait(timeout=300), stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["retrieval", "--help"],
        ["models"],
        ["info", str(TOY)],
        ["induction", str(TOY), "--format", "csv"],
        ["induction", str(TOY)],
    ],
    ids=["version", "help", "models", "info", "induction-csv", "induction-table"],
)
def test_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    status, stderr = run_with_closed_stdout(*args)
    assert status == BROKEN_PIPE_EXIT == 141, (status, stderr)
    for noise in ("error", "Traceback", "BrokenPipe", "Exception ignored"):
        assert noise not in stderr, stderr
