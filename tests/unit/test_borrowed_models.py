"""The model a researcher actually has: a tokenizer from another model and a model whose weights
are not there are refused before any forward pass, with what to do."""

from __future__ import annotations

import pytest
import torch
from conftest import TOY_DIR

import headscope as hs
from headscope.errors import InputError


@pytest.fixture(scope="module")
def toy_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(TOY_DIR), AutoTokenizer.from_pretrained(TOY_DIR)


def test_a_tokenizer_larger_than_the_embedding_is_refused_naming_both_sizes(toy_model, minilm_tokenizer):
    model, _ = toy_model
    rows = model.get_input_embeddings().num_embeddings
    with pytest.raises(
        InputError, match=f"{len(minilm_tokenizer):,} tokens but the model's embedding has {rows:,} rows"
    ):
        hs.scan(model, minilm_tokenizer)
    with pytest.raises(InputError, match="not this model's tokenizer"):
        hs.induction(model, minilm_tokenizer)  # induction used to run on the wrong ids, silently


def test_special_ids_outside_the_embedding_are_refused(toy_model):
    model, tokenizer = toy_model
    rows = model.get_input_embeddings().num_embeddings
    odd = type(tokenizer).from_pretrained(TOY_DIR)
    odd.add_special_tokens({"additional_special_tokens": ["<extra>"]})  # id == rows: past the embedding
    with pytest.raises(
        InputError, match=f"not this model's tokenizer|outside the model's embedding of {rows:,}"
    ):
        hs.induction(model, odd)


def test_a_model_on_the_meta_device_gets_what_to_do():
    from conftest import word_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    with pytest.raises(InputError, match="on the meta device") as refused:
        hs.induction(model, word_tokenizer(64))
    assert "device_map" in str(refused.value) and "load the weights" in str(refused.value)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from headscope.models import bundled_path

    return AutoTokenizer.from_pretrained(bundled_path("minilm-l6"))
