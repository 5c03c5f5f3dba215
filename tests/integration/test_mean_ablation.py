"""Mean ablation uses set-wide means: it cannot depend on how the set is cut into batches, and
it leaves a head whose output never varies exactly as it was. On the shipped toy model."""

from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope import analyses, capture
from headscope.extend.ablation import ablate, later_copy_loss

SPEC = analyses.RepeatSpec(seq_len=16, n_seqs=10, seed=3)
INDUCTION_HEADS = [(1, 0), (1, 1), (1, 2), (1, 3)]  # every layer-1 head of the toy induces


def test_mean_ablation_does_not_depend_on_the_batch_size(toy):
    # 10 sequences: batches of 1 (each its own batch: a batch mean would be a no-op), 4 (a last
    # batch of 2) and all 10 at once.
    results = {
        size: ablate(toy, SPEC, INDUCTION_HEADS, mode="mean", draws=1, batch_size=size, n_resamples=0)
        for size in (1, 4, 10)
    }
    losses = {size: (r.clean.mean, r.topk.mean, r.random.mean) for size, r in results.items()}
    for size in (1, 4):
        assert losses[size] == pytest.approx(losses[10], abs=1e-5), losses
    # And it is a real ablation: removing the induction heads' information hurts copying.
    assert losses[1][1] - losses[1][0] > 0.5, losses


def _toy_with_constant_head(toy):
    """The toy, with attention biases; KV group 0's values are a constant vector, so query heads
    0 and 1 of layer 0 write the same output at every position of every sequence."""
    from transformers import LlamaForCausalLM

    cfg = toy.model.config.__class__(**{**toy.model.config.to_dict(), "attention_bias": True})
    model = LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(toy.model.state_dict(), strict=False)
    assert not unexpected and all(name.endswith(".bias") for name in missing)
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, proj).bias.zero_()
        v_proj = model.model.layers[0].self_attn.v_proj
        head_dim = cfg.head_dim
        v_proj.weight[:head_dim] = 0.0
        v_proj.bias[:head_dim] = torch.randn(head_dim)
    return hs.load(model, toy.tokenizer, capture="stream", name=toy.name)


def test_mean_ablation_of_a_constant_head_changes_nothing(toy):
    loaded = _toy_with_constant_head(toy)
    sequences, specials, offset = analyses.repeated_tokens(loaded, SPEC)
    batches = analyses.model_batches(loaded, sequences, specials, 4)
    n = len(sequences)
    clean = later_copy_loss(loaded, batches, SPEC, offset, n, None)
    heads = [(0, 0)]
    means = capture.head_output_means(loaded, batches, heads)
    mean_ablated = later_copy_loss(
        loaded, batches, SPEC, offset, n, capture.Ablation.of(heads, "mean", means)
    )
    zeroed = later_copy_loss(loaded, batches, SPEC, offset, n, capture.Ablation.of(heads, "zero"))
    assert torch.allclose(mean_ablated[0], clean[0], atol=1e-4)
    # The constant is not nothing: removing it (zero ablation) does change the loss.
    assert not torch.allclose(zeroed[0], clean[0], atol=1e-3)


def test_mean_ablation_without_means_is_refused():
    with pytest.raises(ValueError, match="set-wide means"):
        capture.Ablation.of([(0, 1)], "mean")
