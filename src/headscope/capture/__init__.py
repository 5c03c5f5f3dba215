"""Capture: batches, the forward pass with streaming attention, its reads, edits and hooks, the chunked LM head.

A pass is declared as one object, what it reads and what it edits, and run by the one function::

    capture.run(loaded, batches, Pass(reads=[Attention(on_layer, rows=...), TokenLosses(fn)],
                                      edits=[AblateHeads.of(heads)]))
"""

from headscope.capture import checks, edits, hooks, ledger, logits, reads, rows
from headscope.capture.ablation import Ablation, HeadOutputMeans
from headscope.capture.batch import Batch, make_batches
from headscope.capture.borrow import borrowed
from headscope.capture.dla import HeadWrites
from headscope.capture.edits import AblateHeads, AddVector, Edit, PatchHeads, StreamHeads, applied
from headscope.capture.kvmask import StreamingHeads
from headscope.capture.logits import next_token_losses, output_logits
from headscope.capture.reads import (
    Attention,
    BlockRecorder,
    FinalHidden,
    LayerCallback,
    LayerDone,
    Read,
    TokenLosses,
)
from headscope.capture.spec import Pass
from headscope.capture.stream import (
    STREAM_IMPLEMENTATION,
    block_outputs,
    head_output_means,
    prepared,
    register_streaming_attention,
    run,
    streaming_attention,
)

__all__ = [
    "AblateHeads",
    "Ablation",
    "AddVector",
    "Attention",
    "Batch",
    "BlockRecorder",
    "Edit",
    "FinalHidden",
    "HeadOutputMeans",
    "HeadWrites",
    "LayerCallback",
    "LayerDone",
    "Pass",
    "PatchHeads",
    "Read",
    "STREAM_IMPLEMENTATION",
    "StreamHeads",
    "StreamingHeads",
    "TokenLosses",
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
    "logits",
    "reads",
    "rows",
]
