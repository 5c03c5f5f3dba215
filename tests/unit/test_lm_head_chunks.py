"""The LM head runs a vocabulary slice at a time over blocks of positions (or, for a head that is
not a plain Linear, whole in position chunks): the losses equal those from the model's full logits."""

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


def small_slices(monkeypatch):
    """Blocks of 7 positions, slices of 10 vocabulary rows (the toy's 64: six slices and a ragged one)."""
    monkeypatch.setattr(capture.logits, "_LOSS_BLOCK", 7)
    monkeypatch.setattr(capture.logits, "_LOSS_MIN_SLICE", 1)
    monkeypatch.setattr(capture.logits, "_LOGIT_CHUNK_ELEMENTS", 7 * 10)


def toy_batches(toy):
    sequences, specials, _ = analyses.repeated_tokens(toy, analyses.RepeatSpec(seq_len=20, n_seqs=5))
    return analyses.model_batches(toy, sequences, specials, 3)


def test_toy_chunked_losses_equal_full_logits(toy, monkeypatch):
    batches = toy_batches(toy)
    assert toy.model.get_output_embeddings().weight.shape[0] == 64
    small_slices(monkeypatch)
    for batch, losses in zip(batches, chunked_losses(toy, batches), strict=True):
        assert losses.shape == (batch.input_ids.shape[0], batch.input_ids.shape[1] - 1)
        assert torch.allclose(losses, full_logits_losses(toy, batch), atol=1e-4)


def test_a_head_that_is_not_a_plain_linear_runs_in_position_chunks(toy, monkeypatch):
    batches = toy_batches(toy)
    expected = [full_logits_losses(toy, batch) for batch in batches]
    head = toy.model.get_output_embeddings()
    wrapped = torch.nn.Sequential(head)
    wrapped.weight = head.weight  # what the chunking reads the vocabulary size from
    monkeypatch.setattr(toy.model, "get_output_embeddings", lambda: wrapped)
    monkeypatch.setattr(capture.logits, "_LOGIT_CHUNK_ELEMENTS", 3 * 64 * 7)  # 7 positions per chunk
    calls = []
    monkeypatch.setattr(
        capture.logits,
        "_losses_by_positions",
        lambda *a, real=capture.logits._losses_by_positions: calls.append(1) or real(*a),
    )
    for want, losses in zip(expected, chunked_losses(toy, batches), strict=True):
        assert torch.allclose(losses, want, atol=1e-4)
    assert len(calls) == len(batches)


def test_soft_capped_losses_equal_the_capped_logits(toy, monkeypatch):
    """Gemma 2's final_logit_softcapping, applied slice by slice: the log-softmax of
    cap * tanh(logits / cap) over the whole vocabulary, computed here in float64."""
    (batch,) = toy_batches(toy)[:1]
    with torch.inference_mode():
        hidden = toy.base(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long())[0]
        weight = toy.model.get_output_embeddings().weight.double()
        capped = torch.tanh(hidden[:, :-1].double() @ weight.T / 2.0) * 2.0
        want = -torch.log_softmax(capped, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        monkeypatch.setattr(toy.model.config, "final_logit_softcapping", 2.0, raising=False)
        small_slices(monkeypatch)
        got = capture.next_token_losses(toy, hidden, batch.input_ids)
    assert torch.allclose(got.double(), want, atol=1e-5)
    plain = full_logits_losses(toy, batch).double()
    assert (got.double() - plain).abs().max() > 1e-2  # the cap changed the losses


@pytest.mark.slow
def test_smollm2_chunked_losses_equal_full_logits(smollm2):
    texts = ["The cat sat on the mat because it was warm.", "小明把书给了小红，因为她想读。"]
    enc = [smollm2.tokenizer(t)["input_ids"] for t in texts]
    batches = analyses.model_batches(smollm2, enc, [[False] * len(e) for e in enc], 2)
    for batch, losses in zip(batches, chunked_losses(smollm2, batches), strict=True):
        real = batch.attention_mask[:, 1:]
        assert torch.allclose(losses[real], full_logits_losses(smollm2, batch)[real], atol=1e-4)
