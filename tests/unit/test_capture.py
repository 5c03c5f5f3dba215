"""Capture on the shipped toy model: streaming equals eager, batched equals unbatched."""

from __future__ import annotations

import torch

from headscope import analyses, capture, detectors
from headscope.data.prompts import load_texts


def collect(loaded, batches, **options):
    """Whole per-example maps, reassembled from the query chunks (cut keys are zero)."""
    chunks: dict[int, list[tuple[int, torch.Tensor]]] = {}
    seen: dict[tuple[int, int], torch.Tensor] = {}

    def on_layer(layer, attn, batch, q_start):
        chunks.setdefault(layer, []).append((q_start, attn.clone()))

    def on_layer_done(layer, batch):
        length = batch.input_ids.shape[1]
        parts = chunks.pop(layer)
        assert [start for start, _ in parts] == sorted(start for start, _ in parts)
        full = torch.zeros(*parts[0][1].shape[:2], length, length)
        for start, part in parts:
            full[:, :, start : start + part.shape[2], : part.shape[3]] = part
        for row, example in enumerate(batch.example_index.tolist()):
            n = int(batch.attention_mask[row].sum())
            seen[(example, layer)] = full[row, :, :n, :n]

    attention = capture.Attention(on_layer, on_layer_done=on_layer_done)
    capture.run(loaded, batches, capture.Pass(reads=[attention], **options))
    return seen


def toy_batches(loaded, batch_size, texts):
    sequences, specials = analyses.encode_texts(loaded, load_texts(texts))
    return capture.make_batches(
        sequences, specials, batch_size=batch_size, pad_id=0, is_causal=loaded.is_causal
    )


def test_streaming_matches_eager_output_attentions(toy, toy_eager, toy_texts):
    assert toy.capture_mode == "stream" and toy_eager.capture_mode == "eager"
    streamed = collect(toy, toy_batches(toy, 8, toy_texts))
    eager = collect(toy_eager, toy_batches(toy_eager, 8, toy_texts))
    assert streamed.keys() == eager.keys()
    worst = max((streamed[k] - eager[k]).abs().max().item() for k in streamed)
    assert worst < 1e-5


def test_batched_equals_unbatched(toy, toy_texts):
    one = collect(toy, toy_batches(toy, 1, toy_texts))
    many = collect(toy, toy_batches(toy, 16, toy_texts))
    worst = max((one[k] - many[k]).abs().max().item() for k in one)
    assert worst < 1e-5


def test_streaming_leaves_logits_unchanged(toy, toy_eager):
    ids = torch.tensor([[1, 5, 9, 13, 5, 9]])
    with torch.inference_mode():
        a = toy.model(ids).logits
        b = toy_eager.model(ids).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_scores_identical_between_capture_modes(toy, toy_eager):
    spec = analyses.RepeatSpec(seq_len=20, n_seqs=6, seed=1)
    a = analyses.induction(toy, spec, n_resamples=0).table
    b = analyses.induction(toy_eager, spec, n_resamples=0).table
    assert (a.score - b.score).abs().max() < 1e-5
    assert list(a.columns) == list(b.columns)
    assert set(detectors.REGISTRY) >= set(a.detector)


def test_a_pass_stopped_after_a_layer_gives_that_layers_maps_and_runs_no_later_block(toy, toy_texts):
    """Path patching's corrupted and recording passes end after the last layer they need; what they
    see up to there is what the whole pass sees, and the blocks after it never run."""
    from headscope.capture.patching import record_block_inputs
    from headscope.models.anatomy import blocks

    batches = toy_batches(toy, 4, toy_texts)
    whole = collect(toy, batches)
    ran: list[int] = []
    hooks = [
        block.register_forward_hook(lambda *_, i=i: ran.append(i))
        for i, block in enumerate(blocks(toy.model))
    ]
    try:
        stopped = collect(toy, batches, stop_after=0)
        assert ran == [0] * len(batches)
        ran.clear()
        inputs = record_block_inputs(toy, batches[0], [0])
        assert ran == [0] and set(inputs) == {0}
    finally:
        for hook in hooks:
            hook.remove()
    assert {layer for _, layer in stopped} == {0}
    assert stopped.keys() == {key for key in whole if key[1] == 0}
    for key, maps in stopped.items():
        torch.testing.assert_close(maps, whole[key], rtol=0, atol=0)
    # The model runs whole again afterwards: the stop was a hook, and it is gone.
    assert collect(toy, batches).keys() == whole.keys()
