"""Ground truth for sweeps: a training run whose phase change we know (slow).

tests/toy/train_toy.py --out DIR trains the 2-layer toy for 600 steps and saves checkpoints
before, through and after the induction heads form. Sweeping them must show the phase change:
little induction at the first checkpoint, strong induction at the last, and the largest rise of
the induction score where the repeated-copy loss drops most. Both executors must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from headscope.sweeps.run import sweep
from headscope.sweeps.summary import emergence

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "toy" / "train_toy.py"
OPTIONS = {"seq_len": 20, "repeat_seq": 2, "n_seqs": 16, "resamples": 200, "seed": 0}


@pytest.fixture(scope="module")
def training_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("toyrun") / "toyrun"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--checkpoints", "6"],
        check=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        capture_output=True,
        timeout=900,
    )
    steps = json.loads((out / "steps.json").read_text())
    return out, [c["step"] for c in steps["checkpoints"]]


def test_sweep_sees_the_induction_phase_change_with_both_executors(training_run, tmp_path):
    folder, steps = training_run
    local = sweep([str(folder)], tmp_path / "local", options=OPTIONS, workers=2)
    assert not local.failed and len(local.computed) == len(steps)
    table = local.table
    induction = table[table.detector == "induction"]
    best = induction.groupby("step")["score"].max()
    assert list(best.index) == steps
    assert best.iloc[0] <= 0.2 and best.iloc[-1] >= 0.7

    rows = emergence(table, local.losses)
    row = rows[(rows.role == "ind")].iloc[0]
    rise, drop = row["largest_rise_at"], row["copy_loss_drop_at"]
    assert abs(steps.index(rise) - steps.index(drop)) <= 1, (rise, drop, steps)
    assert row["first_step_per_head"]  # induction heads hold the role by the end

    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = sweep([str(folder)], tmp_path / "ray", options=OPTIONS, executor="ray")
    finally:
        ray.shutdown()
    assert not remote.failed and len(remote.computed) == len(steps)
    columns = ["model", "step", "detector", "layer", "head", "score", "ci_low", "ci_high", "role"]
    left = local.table[columns].sort_values(columns[:5]).reset_index(drop=True)
    right = remote.table[columns].sort_values(columns[:5]).reset_index(drop=True)
    assert left.equals(right)
