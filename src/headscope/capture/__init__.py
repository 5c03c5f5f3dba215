"""Capture: batches, the forward pass with streaming attention, its edits and hooks, the chunked LM head."""

from headscope.capture import checks, edits, hooks, ledger, rows
from headscope.capture.ablation import Ablation, HeadOutputMeans
from headscope.capture.batch import Batch, make_batches
from headscope.capture.borrow import borrowed
from headscope.capture.edits import AblateHeads, AddVector, Edit, PatchHeads, StreamHeads, applied
from headscope.capture.kvmask import StreamingHeads
from headscope.capture.stream import (
    STREAM_IMPLEMENTATION,
    LayerCallback,
    LayerDone,
    block_outputs,
    head_output_means,
    next_token_losses,
    output_logits,
    prepared,
    register_streaming_attention,
    run,
    streaming_attention,
)

__all__ = [
    "AblateHeads",
    "Ablation",
    "AddVector",
    "Batch",
    "Edit",
    "HeadOutputMeans",
    "LayerCallback",
    "LayerDone",
    "PatchHeads",
    "STREAM_IMPLEMENTATION",
    "StreamHeads",
    "StreamingHeads",
    "applied",
    "block_outputs",
    "borrowed",
    "head_output_means",
    "make_batches",
    "next_token_losses",
    "output_logits",
    "prepared",
    "register_streaming_attention",
    "run",
    "streaming_attention",
    "checks",
    "edits",
    "hooks",
    "ledger",
    "rows",
]
