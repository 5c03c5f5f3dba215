"""Analyses: run the model over a data set and call detectors and verdicts (scan, induction, syntax, coref, ablation)."""

# Each analysis is one module (options, check, run, verify, JSON), and importing it registers it in
# extend.protocol.ANALYSES, which serves the API, the CLI and the sweep. They register in the order
# of these imports, the order of the CLI's help and the docs: each module imports at its top only the
# analyses before it (scan imports the others where it uses them).
# isort: off
from headscope.analyses.scan import scan
from headscope.analyses.induction import induction
from headscope.analyses.syntax import check_relations, syntax
from headscope.analyses.coref import coref
from headscope.analyses import retrieval, kvplan, ioi, weights, icl, detect, describe, qk, graph  # noqa: F401

# isort: on
from headscope.data.defaults import DEFAULT_COREF_SETS, DEFAULT_TEXT_SET, DEFAULT_TREEBANKS
from headscope.extend.ablation import (
    AblationResult,
    Head,
    LossEstimate,
    Verification,
    ablate,
    later_copy_loss,
    verify,
)
from headscope.extend.base import (
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
from headscope.extend.copyloss import CopyLossMeter
from headscope.extend.protocol import ANALYSES, get
from headscope.verdicts.heads import random_control, top_heads

__all__ = [
    "ANALYSES",
    "get",
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
