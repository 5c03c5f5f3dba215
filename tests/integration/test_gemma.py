"""Gemma 3 270M: multi-query attention, sliding-window layers (512) between global ones, a
262,144-token vocabulary. Streaming capture must match eager attention far past the window, find
induction heads with a real drop in copy loss, and compute losses without [B, T, vocab] logits."""

from __future__ import annotations

import pytest
import torch

from headscope import analyses, capture, detectors
from headscope.models import load

pytestmark = pytest.mark.slow

TOKEN_DETECTORS = ["previous-token", "sink", "duplicate-token", "induction"]


def scores(loaded, batches, n_examples):
    chosen = detectors.create(TOKEN_DETECTORS)
    results = analyses.score_batches(loaded, batches, chosen, n_examples, "gemma-test")
    return {r.detector: r for r in results}


def test_stream_equals_eager_far_past_the_window(gemma3, monkeypatch):
    # BOS + 350 random tokens twice = 701 tokens: the second copy's earlier occurrences lie 350
    # back, and queries after 512 have keys outside their local layers' window.
    spec = analyses.RepeatSpec(seq_len=350, n_seqs=1, seed=1)
    sequences, specials, _ = analyses.repeated_tokens(gemma3, spec)
    assert len(sequences[0]) > 512 + 128
    batches = analyses.model_batches(gemma3, sequences, specials, 1)
    eager = load("gemma3-270m", capture="eager")
    expected = scores(eager, batches, 1)
    del eager
    # Chunks of 100 query rows: the window edge (query 512) falls inside a chunk.
    monkeypatch.setattr(capture.stream, "_CHUNK_ELEMENTS", 1 * 4 * 701 * 100)
    got = scores(gemma3, batches, 1)
    for name in TOKEN_DETECTORS:
        assert torch.allclose(got[name].scores(), expected[name].scores(), atol=1e-5), name
        assert torch.allclose(got[name].baseline_by_layer(), expected[name].baseline_by_layer(), atol=1e-6)
    # The local layers' uniform reference is their window's: smaller than a global layer's
    # wherever the earlier copy has left the window (sink: key 0 is outside it for most queries).
    sink = got["sink"].baseline_by_layer()
    assert sink[0] < sink[5] and sink[4] < sink[11]


def test_induction_heads_and_copy_loss_drop(gemma3):
    report = analyses.induction(gemma3, analyses.RepeatSpec(seq_len=40, n_seqs=8, seed=0), n_resamples=200)
    table = report.table[report.table.detector == "induction"].sort_values("score", ascending=False)
    best = table.iloc[0]
    assert best.score > 0.5 and best.ci_low > best.baseline + 0.3
    assert (table.role == "ind").any()
    assert report.loss is not None and report.loss.later < report.loss.first / 3


def test_chunked_lm_head_loss_equals_full_logits(gemma3, monkeypatch):
    texts = ["The cat sat on the mat because it was warm.", "小明把书给了小红，因为她想读。"]
    encoded = [gemma3.tokenizer(t)["input_ids"] for t in texts]
    special = [[i == 0 for i in range(len(e))] for e in encoded]
    batches = analyses.model_batches(gemma3, encoded, special, 2)
    # Blocks of 5 positions, slices of 2^20 // 5 = 209,715 vocabulary rows: two, the second ragged.
    monkeypatch.setattr(capture.logits, "_LOSS_BLOCK", 5)
    monkeypatch.setattr(capture.logits, "_LOGIT_CHUNK_ELEMENTS", 1 << 20)
    chunked = []
    losses = capture.TokenLosses(lambda losses, b: chunked.append(losses))
    capture.run(gemma3, batches, capture.Pass(reads=[capture.Attention(lambda *_: None), losses]))
    for batch, losses in zip(batches, chunked, strict=True):
        with torch.inference_mode():
            logits = gemma3.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()
            ).logits
        log_probs = torch.log_softmax(logits[:, :-1].double(), dim=-1)
        full = -log_probs.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        real = batch.attention_mask[:, 1:]
        assert torch.allclose(losses[real].double(), full[real], atol=1e-4)


def test_dla_on_the_real_model_adds_up_and_finds_name_movers(gemma3):
    """On Gemma 3 itself (post-attention norms, (1 + w) RMSNorm, tied 262k unembedding): the
    heads' DLA plus every other component equals the model's logit difference, and IOI works."""
    from headscope.analyses.ioi import _batches, _ends, _names, encode_ioi, ioi
    from headscope.capture.dla import HeadWrites, logit_constant
    from headscope.data.circuits import load_ioi
    from headscope.data.prompts import builtin
    from headscope.models.anatomy import blocks as model_blocks
    from headscope.models.anatomy import post_attention_norm

    ioi_set = load_ioi(builtin("ioi/en.yaml"))
    ioi_set.items = ioi_set.items[::8]  # 24 prompts, every template
    clean, _, _ = encode_ioi(gemma3, ioi_set)
    batch = _batches(gemma3, clean, [list(range(4))])[0]
    writes = HeadWrites(gemma3, _ends, _names)
    rows, ends = torch.arange(4), _ends(batch)
    blocks = model_blocks(gemma3.model)
    block_in, block_out, attn_out, handles = {}, {}, {}, []
    for index, block in enumerate(blocks):
        handles.append(
            block.register_forward_pre_hook(
                lambda m, a, k, i=index: block_in.__setitem__(
                    i, (a[0] if a else k["hidden_states"])[rows, ends].double()
                ),
                with_kwargs=True,
            )
        )
        handles.append(
            block.register_forward_hook(
                lambda m, a, o, i=index: block_out.__setitem__(
                    i, (o[0] if isinstance(o, tuple) else o)[rows, ends].double()
                )
            )
        )
        handles.append(
            post_attention_norm(block).register_forward_hook(
                lambda m, a, o, i=index: attn_out.__setitem__(i, o[rows, ends].double())
            )
        )
    logits = {}
    try:
        hidden = capture.FinalHidden(
            lambda h, b: logits.__setitem__(
                "end", gemma3.model.get_output_embeddings()(h[rows, ends]).double()
            )
        )
        capture.run(gemma3, [batch], capture.Pass(reads=[capture.Attention(lambda *_: None), writes, hidden]))
    finally:
        for handle in handles:
            handle.remove()
    target, foil = _names(batch)
    total = writes.dla.sum((1, 2)) + writes.bias_dla.sum(1) + writes.residual_dla(block_in[0])
    for index in range(len(blocks)):
        total += writes.residual_dla(block_out[index] - block_in[index] - attn_out[index])
    total += logit_constant(writes, target, foil)
    real = logits["end"][rows, target] - logits["end"][rows, foil]
    assert torch.allclose(total, real, atol=1e-2, rtol=1e-3), (total, real)

    report, outcome, _ = ioi(gemma3, ioi_set, n_resamples=500, patch=False)
    assert outcome.accuracy >= 0.9 and outcome.logit_diff > 2.0
    assert (report.table.role == "nm").sum() >= 1
