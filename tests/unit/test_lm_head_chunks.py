"""The LM head runs in position chunks: the losses equal those from the model's full logits."""

from __future__ import annotations

import pytest
import torch

from headscope import analyses, capture


def full_logits_losses(loaded, batch):
    with torch.inference_mode():
        logits = loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    # In float64: torch's float32 cross_entropy over a [B, V, T] view is itself ~2e-4 off on SmolLM2.
    log_probs = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    return -log_probs.gather(-1, batch.input_ids[:, 1:, None])[..., 0].float()


def chunked_losses(loaded, batches):
    out = []
    losses = capture.TokenLosses(lambda losses, b: out.append(losses.clone()))
    capture.run(loaded, batches, capture.Pass(reads=[capture.Attention(lambda *_: None), losses]))
    return out


def test_toy_chunked_losses_equal_full_logits(toy, monkeypatch):
    sequences, specials, _ = analyses.repeated_tokens(toy, analyses.RepeatSpec(seq_len=20, n_seqs=5))
    batches = analyses.model_batches(toy, sequences, specials, 3)
    monkeypatch.setattr(capture.stream, "_LOGIT_CHUNK_ELEMENTS", 3 * 64 * 7)  # 7 positions per chunk
    for batch, losses in zip(batches, chunked_losses(toy, batches), strict=True):
        assert losses.shape == (batch.input_ids.shape[0], batch.input_ids.shape[1] - 1)
        assert torch.allclose(losses, full_logits_losses(toy, batch), atol=1e-4)


@pytest.mark.slow
def test_smollm2_chunked_losses_equal_full_logits(smollm2):
    texts = ["The cat sat on the mat because it was warm.", "小明把书给了小红，因为她想读。"]
    enc = [smollm2.tokenizer(t)["input_ids"] for t in texts]
    batches = analyses.model_batches(smollm2, enc, [[False] * len(e) for e in enc], 2)
    for batch, losses in zip(batches, chunked_losses(smollm2, batches), strict=True):
        real = batch.attention_mask[:, 1:]
        assert torch.allclose(losses[real], full_logits_losses(smollm2, batch)[real], atol=1e-4)
