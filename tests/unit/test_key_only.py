"""The key-only edit (:class:`headscope.capture.edits.KeyOnly`, qk's causal check) on the toy:

* several on one layer compose: two removals are the same edit as one removing their sum (the first
  used to be dropped silently, the pass being that of the second alone);
* a removal of another shape than the block's input, or a value that is not a tensor, is refused as
  an :class:`~headscope.errors.InputError` naming ``removed(batch)`` and the shape to return (it used
  to escape as torch's RuntimeError), and a source name where the function goes, or a layer given as
  a string, is refused before any forward pass;
* a model borrowed from the user comes back as it was when the edit is refused mid-pass.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TOY_DIR

import headscope as hs
from headscope import capture
from headscope.capture import Attention, Pass
from headscope.capture.edits import KeyOnly
from headscope.errors import InputError
from headscope.extend.base import RepeatSpec, model_batches, repeated_tokens


def _batches(loaded, n=1):
    sequences, specials, _ = repeated_tokens(loaded, RepeatSpec(seq_len=10, repeats=2, n_seqs=n, seed=0))
    return model_batches(loaded, sequences, specials, 1)


def _layer_maps(loaded, batches, edits=()):
    maps = {}

    def keep(layer, weights, batch, q_start):
        maps.setdefault(layer, []).append(weights.clone())

    capture.run(loaded, batches, Pass(reads=[Attention(keep)], edits=list(edits)))
    return {layer: torch.cat(w, 2) for layer, w in maps.items()}


def _removals(loaded, batches, n=3):
    """``n`` random removals, each a function of the batch giving [1, T, d_model] per example (seeded)."""
    generator = torch.Generator().manual_seed(11)
    drawn = [
        {
            int(b.example_index[0]): torch.randn(
                1, b.input_ids.shape[1], loaded.layout.d_model, generator=generator
            )
            for b in batches
        }
        for _ in range(n)
    ]
    return [lambda batch, one=one: one[int(batch.example_index[0])] for one in drawn]


def test_two_key_only_edits_on_one_layer_are_one_edit_removing_both(toy):
    batches = _batches(toy, 2)
    first, second, third = _removals(toy, batches)
    both = _layer_maps(toy, batches, [KeyOnly(1, first), KeyOnly(1, second)])
    combined = _layer_maps(toy, batches, [KeyOnly(1, lambda b: first(b) + second(b))])
    alone = _layer_maps(toy, batches, [KeyOnly(1, second)])
    assert torch.allclose(both[1], combined[1], atol=1e-6, rtol=0)
    assert (both[1] - alone[1]).abs().max() > 0.1  # the first is not dropped (it was: 0 here)
    assert torch.equal(both[0], alone[0])  # layer 0 is untouched either way
    three = _layer_maps(toy, batches, [KeyOnly(1, first), KeyOnly(1, second), KeyOnly(1, third)])
    summed = _layer_maps(toy, batches, [KeyOnly(1, lambda b: first(b) + second(b) + third(b))])
    assert torch.allclose(three[1], summed[1], atol=1e-6, rtol=0)


def _hooks(model):
    return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]


@pytest.mark.parametrize(
    ("removed", "message"),
    [
        (lambda b: torch.zeros(3), r"KeyOnly: removed\(batch\) has shape \[3\], not the block input's"),
        (lambda b: torch.zeros(b.input_ids.shape[1], 64), r"removed\(batch\) has shape \[\d+, 64\]"),
        (lambda b: torch.zeros(1, b.input_ids.shape[1], 63), r"removed\(batch\) has shape \[1, \d+, 63\]"),
        (lambda b: [0.0], r"KeyOnly: removed\(batch\) returned \[0.0\] \(list\), not a tensor"),
    ],
)
def test_a_removal_of_the_wrong_shape_is_refused_naming_what_to_return(toy, removed, message):
    batches = _batches(toy)
    before = _hooks(toy.model)
    with pytest.raises(InputError, match=message) as refused:
        _layer_maps(toy, batches, [KeyOnly(1, removed)])
    assert "return [batch, tokens, d_model] = [1, " in str(refused.value)
    assert _hooks(toy.model) == before


def test_a_source_name_or_a_string_layer_is_refused_before_any_forward_pass(toy, monkeypatch):
    calls = []
    monkeypatch.setattr(type(toy.base), "__call__", lambda *a, **k: calls.append(1))
    zeros = lambda b: torch.zeros(1)  # noqa: E731
    refusals = [
        (
            KeyOnly(1, "L0H1"),
            r"KeyOnly: removed 'L0H1' \(str\) is not a function \(give a function of the batch",
        ),
        (KeyOnly("1", zeros), r"KeyOnly: layer '1' \(str\) is not an int \(give the layer as an int"),
        (KeyOnly(True, zeros), r"KeyOnly: layer True \(bool\) is not an int"),
        (KeyOnly(1.0, zeros), r"KeyOnly: layer 1.0 \(float\) is not an int"),
    ]
    for edit, message in refusals:
        with pytest.raises(InputError, match=message):
            capture.run(toy, _batches(toy), Pass(edits=[edit]))
    assert calls == []


def test_a_borrowed_model_comes_back_as_it_was_when_the_edit_is_refused_mid_pass():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    model.train()
    model.model.layers[0].register_forward_hook(lambda *_: None)  # the user's own
    implementation = model.config._attn_implementation
    hooks = _hooks(model)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = hs.load(model, AutoTokenizer.from_pretrained(TOY_DIR))
    with pytest.raises(InputError, match="has shape"):
        _layer_maps(loaded, _batches(loaded), [KeyOnly(1, lambda b: torch.zeros(2, 2))])
    with pytest.raises(InputError, match="is not a function"):
        _layer_maps(loaded, _batches(loaded), [KeyOnly(1, "L0H1")])
    assert _hooks(model) == hooks
    assert model.training and model.config._attn_implementation == implementation
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
