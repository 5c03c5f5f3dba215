"""The in-context-learning phase change on a toy, measured by headscope: induction heads and the ICL
score on one step axis.

Run by scripts/docs.py for docs/icl.md ("Emergence on a toy"); its output is generated there:

    python scripts/icl_emergence.py [SEED]

tests/toy/train_markov.py trains a 2-layer attention-only Llama on in-context Markov chains (Edelman
et al. 2024) for 600 steps and keeps 8 checkpoints, dense where its own held-out ICL score falls.
headscope then sweeps the checkpoints with two analyses, the way a user would:

* ``induction`` (repeated random tokens): the best head's induction score at each step;
* ``icl`` on the toy's held-out chains (``--set text=heldout.txt``): the ICL score, the loss at token
  95 minus the loss at token 7 (±2 tokens; a chain has 100 tokens), with its interval over chains.

and prints where each changes most between consecutive checkpoints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

from headscope.sweeps.run import sweep  # noqa: E402

TRAINER = Path(__file__).resolve().parents[1] / "tests" / "toy" / "train_markov.py"
ICL = {"tasks": "none", "context": 100, "early": 7, "late": 95, "window": 2}
REPEAT = {"seq_len": 20, "repeat_seq": 2, "n_seqs": 16}


def measure(folder: Path, store: Path, workers: int = 2):
    """Sweep ``induction`` and ``icl`` over the checkpoints in ``folder``: (steps, per step the best
    induction score, per step the ICL score and its interval, the emergence table)."""
    options = {"resamples": 500, "seed": 0, **REPEAT, **ICL, "text": str(folder / "heldout.txt")}
    result = sweep([str(folder)], store, analyses=("induction", "icl"), options=options, workers=workers)
    if result.failed:
        raise SystemExit(f"sweep failed: {result.failed}")
    table = result.table
    induction = table[(table.detector == "induction") & (table.analysis == "induction")]
    best = induction.groupby("step")["score"].max()
    icl = result.losses.dropna(subset=["icl_score"]).set_index("step").sort_index()
    return list(best.index), best, icl, result.emergence()


def main() -> None:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "markov"
        subprocess.run(
            [sys.executable, str(TRAINER), "--out", str(folder), "--checkpoints", "8", "--seed", str(seed)],
            check=True,
            capture_output=True,
        )
        steps, best, icl, rise = measure(folder, Path(tmp) / "store")
    print(f"toy: 2-layer attention-only Llama on in-context Markov chains (seed {seed}), 8 checkpoints")
    print(f"{'step':>5}  {'best induction':>14}  {'ICL score [95% CI]':>26}")
    for step in steps:
        row = icl.loc[step]
        print(
            f"{step:>5}  {best.loc[step]:>14.3f}  {row.icl_score:>+8.3f} [{row.icl_score_low:+.3f}, {row.icl_score_high:+.3f}]"
        )
    ind = rise[(rise.analysis == "induction") & (rise.role == "ind")].iloc[0]
    rise_at, drop_at = int(ind["largest_rise_at"]), int(ind["icl_score_drop_at"])
    apart = abs(steps.index(rise_at) - steps.index(drop_at))
    print(
        f"largest rise of the induction score: at step {rise_at}; largest fall of the ICL score: at step "
        f"{drop_at} ({apart} checkpoint{'s' if apart != 1 else ''} apart)"
    )


if __name__ == "__main__":
    main()
