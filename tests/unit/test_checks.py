"""The decomposition checks catch what they are for: each known way of getting a family wrong
(a post-norm ignored, a multiplier ignored, W_V read from the wrong rows, a logit scale missed, a
broken attention function) is planted in a model that otherwise passes, and must be refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import word_tokenizer
from tiny_models import tiny_gemma, tiny_gpt2, tiny_llama

import headscope as hs
from headscope.capture import checks
from headscope.errors import Unsupported
from headscope.models import anatomy, projections


def _fresh(loaded):
    """The same model, with nothing cached from earlier checks."""
    checks._CACHE.pop(loaded.model, None)
    return loaded


def tiny_granite():
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        residual_multiplier=0.3,
        logits_scaling=4.0,
        embedding_multiplier=6.0,
        attention_multiplier=0.2,
    )
    torch.manual_seed(0)
    model = GraniteForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.2)
    return hs.load(model, word_tokenizer(50), name="granite")


@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma, tiny_gpt2, tiny_granite])
def test_every_view_passes_on_a_faithfully_read_model(build):
    loaded = _fresh(build())
    for view in checks.VIEWS:
        result = checks.check(loaded, view)
        assert result.ok, (view, result)
        assert result.error < 1e-4, (view, result)


def test_an_ignored_post_norm_is_caught(monkeypatch):
    """OLMo 2's bug: the norm on the attention output left out of the heads' writes."""
    loaded = _fresh(tiny_gemma())
    monkeypatch.setattr(anatomy, "post_attention_norm", lambda block: None)
    result = checks.check(loaded, "dla")
    assert not result.ok and "residual update" in result.reason


def test_an_ignored_residual_multiplier_is_caught(monkeypatch):
    """Granite's bug: residual_multiplier left out, DLA about 3x too large here."""
    loaded = _fresh(tiny_granite())
    monkeypatch.setattr(anatomy, "residual_multiplier", lambda config: 1.0)
    assert not checks.check(loaded, "dla").ok


def test_an_ignored_logit_scale_is_caught(monkeypatch):
    loaded = _fresh(tiny_granite())
    monkeypatch.setattr(anatomy, "logit_multiplier", lambda config: 1.0)
    result = checks.check(loaded, "dla")
    assert not result.ok and "logits" in result.reason


def test_value_rows_read_from_the_wrong_heads_are_caught(monkeypatch):
    """CodeGen's bug: W_V taken from the wrong rows of a fused projection."""
    loaded = _fresh(tiny_llama())
    real = projections.value_path

    def shuffled(attention, config):
        path = real(attention, config)
        return dataclasses.replace(path, linear=path.linear.roll(1, dims=0), bias=None)

    monkeypatch.setattr(projections, "value_path", shuffled)
    result = checks.check(loaded, "ov")
    assert not result.ok and "one-token output" in result.reason


def test_require_refuses_with_the_view_and_the_reason(monkeypatch):
    loaded = _fresh(tiny_gemma())
    monkeypatch.setattr(anatomy, "post_attention_norm", lambda block: None)
    with pytest.raises(Unsupported, match="direct logit attribution.*residual update"):
        checks.require(loaded, "dla")
    with pytest.raises(Unsupported, match="direct logit attribution"):
        hs.ioi(loaded)


def test_a_broken_streaming_function_falls_back_to_eager_under_auto(monkeypatch):
    from headscope.capture import stream

    loaded = _fresh(tiny_llama())
    loaded.capture_requested = "auto"  # as hs.load(model, tokenizer) leaves it by default
    assert loaded.capture_mode == "stream"
    real = stream.streaming_attention

    def broken(module, query, key, value, attention_mask, **kwargs):
        out, weights = real(module, query, key, value, attention_mask, **kwargs)
        return out * 1.5, weights

    from transformers import AttentionInterface

    stream.register_streaming_attention()
    monkeypatch.setitem(AttentionInterface._global_mapping, stream.STREAM_IMPLEMENTATION, broken)
    checks.require(loaded, "maps")
    assert loaded.capture_mode == "eager"
    assert checks.check(loaded, "maps").ok


def test_under_stream_a_broken_streaming_function_is_refused(monkeypatch):
    from transformers import AttentionInterface

    from headscope.capture import stream

    loaded = _fresh(tiny_llama())  # loaded with capture="stream": no fallback
    real = stream.streaming_attention

    def broken(module, query, key, value, attention_mask, **kwargs):
        out, weights = real(module, query, key, value, attention_mask, **kwargs)
        return out * 1.5, weights

    stream.register_streaming_attention()
    monkeypatch.setitem(AttentionInterface._global_mapping, stream.STREAM_IMPLEMENTATION, broken)
    with pytest.raises(Unsupported, match="streamed attention differs"):
        checks.require(loaded, "maps")
