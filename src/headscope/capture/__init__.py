"""Capture: batches, the forward pass with streaming attention, ablation hooks, the chunked LM head."""

from headscope.capture import checks, ledger, rows
from headscope.capture.ablation import Ablation, HeadOutputMeans
from headscope.capture.batch import Batch, make_batches
from headscope.capture.borrow import borrowed
from headscope.capture.kvmask import StreamingHeads
from headscope.capture.stream import (
    STREAM_IMPLEMENTATION,
    LayerCallback,
    LayerDone,
    head_output_means,
    next_token_losses,
    output_logits,
    prepared,
    register_streaming_attention,
    run,
    streaming_attention,
)

__all__ = [
    "Ablation",
    "Batch",
    "HeadOutputMeans",
    "LayerCallback",
    "LayerDone",
    "STREAM_IMPLEMENTATION",
    "StreamingHeads",
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
    "ledger",
    "rows",
]
