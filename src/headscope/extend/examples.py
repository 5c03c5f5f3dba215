"""The HTML report's attention heatmaps: every head's map on three small examples.

English prose, repeated random tokens and a Chinese sentence, run through the model itself when the
report is built, and stored as one byte per weight (``headscope.outputs.report_data`` embeds them).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

from headscope import capture
from headscope.data.align import encode_with_offsets
from headscope.data.prompts import builtin, load_texts

from .base import RepeatSpec, repeated_tokens
from .show import token_label

MAX_EXAMPLE_TOKENS = 64


def attention_examples(loaded: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Every head's map on English prose, repeated random tokens and a Chinese sentence."""
    texts = load_texts(builtin("report/examples.yaml"))
    inputs: list[tuple[str, list[int], list[bool], list[str]]] = []
    tokenizer = loaded.tokenizer
    limit = min(MAX_EXAMPLE_TOKENS, loaded.max_positions or MAX_EXAMPLE_TOKENS)
    for item in texts.items:
        ids, special, offsets = encode_with_offsets(tokenizer, item.text)
        ids, special, offsets = ids[:limit], special[:limit], offsets[:limit]
        pieces = tokenizer.convert_ids_to_tokens(ids)
        labels = [token_label(item.text, o, t, s) for o, t, s in zip(offsets, pieces, special, strict=True)]
        inputs.append(("English prose" if item.id == "english" else "Chinese sentence", ids, special, labels))
    half = max(2, (limit - 2) // 2)
    sequences, specials, _ = repeated_tokens(
        loaded, RepeatSpec(seq_len=min(20, half), repeats=2, n_seqs=1, seed=seed)
    )
    labels = [
        ("⟨s⟩" if s else tokenizer.convert_ids_to_tokens([i])[0])
        for i, s in zip(sequences[0], specials[0], strict=True)
    ]
    inputs.insert(1, ("repeated random tokens", sequences[0], specials[0], labels))

    layout = loaded.layout
    out = []
    for name, ids, special, labels in inputs:
        length = len(ids)
        maps = torch.zeros(layout.n_layers, layout.n_heads, length, length)

        def on_layer(
            layer: int, attn: torch.Tensor, _batch: Any, q_start: int, maps: torch.Tensor = maps
        ) -> None:
            rows = attn.shape[2]
            maps[layer, :, q_start : q_start + rows, : attn.shape[3]] = attn[0].float().cpu()

        batch = capture.make_batches([ids], [special], batch_size=1, pad_id=0, is_causal=loaded.is_causal)[0]
        capture.run(loaded, [batch], capture.Pass(reads=[capture.Attention(on_layer)]))
        quantised = np.clip(np.rint(maps.numpy() * 255.0), 0, 255).astype(np.uint8)
        encoded = {
            f"{layer},{head}": base64.b64encode(quantised[layer, head].tobytes()).decode("ascii")
            for layer in range(layout.n_layers)
            for head in range(layout.n_heads)
        }
        out.append({"name": name, "tokens": labels, "maps": encoded})
    return out
