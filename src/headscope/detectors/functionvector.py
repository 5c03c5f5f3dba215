"""Function-vector heads (Todd et al. 2024): the role ``headscope icl`` gives from a patching effect.

Not an attention pattern and not in the scan's registry: the score of a head is its average indirect
effect (AIE), the gain in the correct answer's probability when its mean output over clean few-shot
prompts is patched into prompts with shuffled labels (:mod:`headscope.analyses.icl`). The role is
declared here, beside the other detectors', so that the role map, the legends, the CSV and the HTML
report find it like any other.
"""

from __future__ import annotations

import torch

from headscope.capture import Batch
from headscope.detectors.base import Detector, RoleSpec
from headscope.errors import RunFailure


class FunctionVectorScore(Detector):
    name = "fv"
    summary = (
        "average indirect effect: the gain in the answer's probability when the head's mean output over "
        "clean few-shot prompts replaces its output in shuffled-label prompts (at the last token)"
    )
    baseline_kind = "zero"
    part = "score"  # icl scores it by patching; never a scan's detector
    role = RoleSpec(
        "fv",
        "function-vector head (its mean output carries a few-shot task)",
        "#e8590c",
        "bold dark_orange",
        data="few-shot tasks with shuffled labels",
        verify="few-shot-accuracy",
        kind="signed",
    )

    def update(self, layer: int, attn: torch.Tensor, batch: Batch, q_start: int = 0) -> None:
        raise RunFailure(
            "function-vector heads are scored by patching (headscope icl), not from attention maps"
        )
