"""Uniform baselines count the keys each layer's own mask leaves visible (sliding windows
included), eager and streaming capture agree on them, and a causal layer never runs unmasked.

The model is a tiny randomly initialised Gemma 3 (transformers' own architecture, built from a
config, nothing downloaded): two sliding-window layers (window 4) and one global layer, four query
heads over one KV head, as in Gemma 3 270M.
"""

from __future__ import annotations

import pytest
import torch
from conftest import word_tokenizer

import headscope as hs
from headscope import capture
from headscope.detectors import REGISTRY, create
from headscope.errors import RunFailure
from headscope.models import LoadedModel

WINDOW = 4
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"]
LENGTH = 12  # BOS + 11 tokens: well past the window


def tiny_gemma(capture_mode: str) -> LoadedModel:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    return hs.load(model, word_tokenizer(config.vocab_size), capture=capture_mode, name="tiny-gemma3")


def batches(n: int = 3, repeat: bool = False) -> list[capture.Batch]:
    gen = torch.Generator().manual_seed(1)
    if repeat:  # BOS + 5 random tokens, repeated: the earlier copy is 5 back, past the window of 4
        body = [torch.randint(3, 64, (5,), generator=gen).tolist() * 2 for _ in range(n)]
        rows = [[2, *b, 7] for b in body]
    else:
        rows = [[2, *torch.randint(3, 64, (LENGTH - 1,), generator=gen).tolist()] for _ in range(n)]
    specials = [[True] + [False] * (len(r) - 1) for r in rows]
    return capture.make_batches(rows, specials, batch_size=n, pad_id=0, is_causal=True)


def scored(loaded: LoadedModel, names: list[str], data: list[capture.Batch]):
    chosen = create(names)
    n_examples = sum(len(b.example_index) for b in data)
    for detector in chosen:
        detector.start(loaded.layout, n_examples)

    def on_layer(layer, attn, batch, q_start):
        for detector in chosen:
            detector.update(layer, attn, batch, q_start)

    def on_done(layer, batch):
        for detector in chosen:
            detector.end_layer(layer, batch)

    capture.run(loaded, data, capture.Pass(reads=[capture.Attention(on_layer, on_layer_done=on_done)]))
    return {r.detector: r for d in chosen for r in d.results()}


def visible_keys(query: int, layer_type: str) -> int:
    """Keys a query sees: all earlier ones, or the last WINDOW (itself included) in a local layer."""
    return min(query + 1, WINDOW) if layer_type == "sliding_attention" else query + 1


@pytest.fixture(scope="module")
def stream_results():
    return scored(tiny_gemma("stream"), ["sink", "previous-token"], batches())


def test_sink_baseline_is_zero_past_the_window_and_per_layer(stream_results):
    by_layer = stream_results["sink"].baseline_by_layer()
    for layer, kind in enumerate(LAYER_TYPES):
        # Queries 1..11; key 0 is visible only while the query is inside the window of it.
        expected = [
            (1.0 / visible_keys(q, kind)) if (kind == "full_attention" or q < WINDOW) else 0.0
            for q in range(1, LENGTH)
        ]
        assert by_layer[layer].item() == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert by_layer[0] < by_layer[2]  # the local layers' reference is not the global one's


def test_previous_token_baseline_counts_the_window(stream_results):
    by_layer = stream_results["previous-token"].baseline_by_layer()
    for layer, kind in enumerate(LAYER_TYPES):
        # Previous-token queries are 2..11 (the token before query 1 is BOS, excluded).
        expected = [1.0 / visible_keys(q, kind) for q in range(2, LENGTH)]
        assert by_layer[layer].item() == pytest.approx(sum(expected) / len(expected), abs=1e-6)


def test_eager_capture_reads_the_same_visibility_off_the_weights(stream_results):
    eager = scored(tiny_gemma("eager"), ["sink", "previous-token"], batches())
    for name in ("sink", "previous-token"):
        assert torch.allclose(eager[name].baseline_by_layer(), stream_results[name].baseline_by_layer())
        assert torch.allclose(eager[name].scores(), stream_results[name].scores(), atol=1e-5)


def test_induction_targets_outside_the_window_add_nothing_to_the_baseline():
    """The earlier copy sits 5 tokens back; a window of 4 hides it, so uniform attention finds none."""
    results = scored(tiny_gemma("stream"), ["induction", "duplicate-token"], batches(repeat=True))
    for name in ("induction", "duplicate-token"):
        by_layer = results[name].baseline_by_layer()
        assert by_layer[0].item() == 0.0 and by_layer[1].item() == 0.0
        assert by_layer[2].item() > 0.0
        # And a local head cannot attend there: its score is exactly zero too.
        assert results[name].scores()[:2].abs().max().item() < 1e-7


def test_chunks_that_straddle_the_window_edge_match_whole_maps(monkeypatch):
    whole = scored(tiny_gemma("stream"), ["sink", "previous-token"], batches())
    # 3 query rows per chunk ([B=3, H=4, c, K<=12]): chunks end before, across and after the window edge.
    monkeypatch.setattr(capture.stream, "_CHUNK_ELEMENTS", 3 * 4 * LENGTH * 3)
    chunked = scored(tiny_gemma("stream"), ["sink", "previous-token"], batches())
    for name in ("sink", "previous-token"):
        assert torch.allclose(chunked[name].scores(), whole[name].scores(), atol=1e-6)
        assert torch.allclose(chunked[name].baseline_by_layer(), whole[name].baseline_by_layer())


class _CausalModule(torch.nn.Module):
    is_causal = True


def test_streaming_attention_refuses_a_causal_layer_without_a_mask():
    query = torch.randn(1, 2, 5, 4)
    key = value = torch.randn(1, 2, 5, 4)
    with pytest.raises(RunFailure, match="no mask"):
        capture.streaming_attention(_CausalModule(), query, key, value, None)
    # An encoder layer without a mask is fine: every key is visible.
    encoder = torch.nn.Module()
    output, _ = capture.streaming_attention(encoder, query, key, value, None)
    assert output.shape == (1, 5, 2, 4)


def test_stream_equals_eager_far_past_the_window_with_every_token_detector(monkeypatch):
    """40 tokens, window 4, chunks of 5 queries: the local layers skip the keys before the window."""
    gen = torch.Generator().manual_seed(2)
    body = [torch.randint(3, 64, (13,), generator=gen).tolist() * 3 for _ in range(2)]
    rows = [[2, *b] for b in body]
    data = capture.make_batches(rows, [[True] + [False] * 39] * 2, batch_size=2, pad_id=0, is_causal=True)
    # Every token-level detector of the registry (those that read text or repeated random tokens).
    names = [n for n, cls in REGISTRY.builtins().items() if cls.default_source in ("text", "repeated-tokens")]
    eager = scored(tiny_gemma("eager"), names, data)
    firsts = []
    original = capture.stream._plan

    def plan(*args, **kwargs):
        chunks = original(*args, **kwargs)
        firsts.extend(first for _, _, first, _ in chunks)
        return chunks

    monkeypatch.setattr(capture.stream, "_plan", plan)
    monkeypatch.setattr(capture.stream, "_CHUNK_ELEMENTS", 2 * 4 * 40 * 5)
    stream = scored(tiny_gemma("stream"), names, data)
    assert max(firsts) > 0  # keys before the window really were skipped
    for name in names:
        assert torch.allclose(stream[name].scores(), eager[name].scores(), atol=1e-5), name
        assert torch.allclose(stream[name].baseline_by_layer(), eager[name].baseline_by_layer(), atol=1e-6)


def test_info_names_local_and_global_layers():
    from transformers import Gemma3TextConfig, LlamaConfig

    from headscope.models.layout import layer_attention

    types = ["sliding_attention"] * 5 + ["full_attention"]
    gemma = Gemma3TextConfig(num_hidden_layers=18, sliding_window=512, layer_types=types * 3)
    kinds = layer_attention(gemma, 18)
    assert kinds["global_layers"] == [5, 11, 17] and kinds["window"] == 512
    assert kinds["summary"] == "local (window 512): 0–4, 6–10, 12–16; global: 5, 11, 17"
    plain = layer_attention(LlamaConfig(num_hidden_layers=4), 4)
    assert plain["local_layers"] == [] and plain["summary"] == "global in every layer"
