"""Analyses: run the model over a data set and call detectors and verdicts (scan, induction, syntax, coref, ablation)."""

from headscope.analyses.ablation import (
    AblationResult,
    Head,
    LossEstimate,
    Verification,
    ablate,
    later_copy_loss,
    verify,
)
from headscope.analyses.base import (
    CopyLoss,
    ProgressFactory,
    RepeatSpec,
    Report,
    Section,
    check_context,
    encode_texts,
    model_batches,
    repeated_tokens,
    score_batches,
)
from headscope.analyses.coref import coref
from headscope.analyses.induction import CopyLossMeter, induction
from headscope.analyses.scan import DEFAULT_COREF_SETS, DEFAULT_TEXT_SET, DEFAULT_TREEBANKS, scan
from headscope.analyses.syntax import check_relations, syntax
from headscope.verdicts.heads import random_control, top_heads

__all__ = [
    "AblationResult",
    "CopyLoss",
    "CopyLossMeter",
    "DEFAULT_COREF_SETS",
    "DEFAULT_TEXT_SET",
    "DEFAULT_TREEBANKS",
    "Head",
    "LossEstimate",
    "ProgressFactory",
    "RepeatSpec",
    "Report",
    "Section",
    "Verification",
    "ablate",
    "check_context",
    "check_relations",
    "coref",
    "encode_texts",
    "induction",
    "later_copy_loss",
    "model_batches",
    "random_control",
    "repeated_tokens",
    "scan",
    "score_batches",
    "syntax",
    "top_heads",
    "verify",
]

# The analyses behind the API, the CLI and the sweep register themselves (analyses.protocol.ANALYSES).
from headscope.analyses import catalog  # noqa: E402, F401, I001
