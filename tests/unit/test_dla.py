"""Direct logit attribution adds up: every head's DLA plus the other components' equals the real
logit difference, to 1e-3, on tiny random models whose other components are computed here too.

Three architectures cover the cases: Llama (GQA, RMSNorm, untied unembedding, o_proj bias
switched on), Gemma 3 (MQA, ``(1 + w)`` RMSNorm, post-attention norms, tied unembedding, sliding
window) and GPT-2 (LayerNorm with bias, Conv1D ``c_proj``).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_gemma, tiny_gpt2, tiny_llama

from headscope import capture
from headscope.capture.dla import HeadWrites, logit_constant
from headscope.capture.patching import record_block_inputs, rerun_block
from headscope.models.anatomy import blocks as model_blocks
from headscope.models.anatomy import post_attention_norm


def _batch(vocab: int) -> capture.Batch:
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (9, 7, 12)]
    specials = [[False] * len(r) for r in rows]
    return capture.make_batches(rows, specials, batch_size=3, pad_id=0, is_causal=True)[0]


def _last(batch: capture.Batch) -> torch.Tensor:
    return batch.attention_mask.sum(1) - 1


@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma, tiny_gpt2], ids=["llama", "gemma3", "gpt2"])
def test_heads_plus_other_components_equal_the_logit_difference(build):
    loaded = build()
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    batch = _batch(vocab)
    target = torch.tensor([5, 6, 7])
    foil = torch.tensor([9, 4, 11])
    positions = _last(batch)
    writes = HeadWrites(loaded, lambda b: positions, lambda b: (target, foil))

    # The other components, from hooks: what each block adds to the residual stream, the part of it
    # that comes from attention, and the residual entering the first block (the embeddings).
    blocks = model_blocks(loaded.model)
    rows = torch.arange(3)
    block_in, block_out, attn_out = {}, {}, {}
    handles = []
    for index, block in enumerate(blocks):

        def pre(module, args, kwargs, index=index):
            hidden = args[0] if args else kwargs["hidden_states"]
            block_in[index] = hidden[rows, positions].double()

        def post(module, args, kwargs, output, index=index):
            hidden = output[0] if isinstance(output, tuple) else output
            block_out[index] = hidden[rows, positions].double()

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post, with_kwargs=True))
        norm = post_attention_norm(block)
        attention = getattr(block, "self_attn", None) or block.attn

        def grab(module, args, output, index=index):
            hidden = output[0] if isinstance(output, tuple) else output
            attn_out[index] = hidden[rows, positions].double()

        handles.append((norm if norm is not None else attention).register_forward_hook(grab))
    logits = {}

    def on_hidden(hidden, b):
        logits["all"] = loaded.model.get_output_embeddings()(hidden[rows, positions]).double()

    try:
        reads = [capture.Attention(lambda *_: None), writes, capture.FinalHidden(on_hidden)]
        capture.run(loaded, [batch], capture.Pass(reads=reads))
    finally:
        for handle in handles:
            handle.remove()

    assert writes.dla is not None and writes.bias_dla is not None
    total = writes.dla.sum((1, 2)) + writes.bias_dla.sum(1)
    total = total + writes.residual_dla(block_in[0])  # embeddings (and positions)
    for index in range(len(blocks)):
        mlp = block_out[index] - block_in[index] - attn_out[index]
        total = total + writes.residual_dla(mlp)
    total = total + logit_constant(writes, target, foil)
    real = logits["all"][rows, target] - logits["all"][rows, foil]
    assert torch.allclose(total, real, atol=1e-3), (total, real)
    # The heads matter: their DLA is not a rounding error of the total.
    assert writes.dla.abs().sum() > 1e-2


def test_head_writes_sum_to_the_attention_block_output():
    loaded = tiny_gemma()
    batch = _batch(64)
    positions = _last(batch)
    writes = HeadWrites(loaded, lambda b: positions, keep={0, 1, 2})
    blocks = model_blocks(loaded.model)
    rows = torch.arange(3)
    seen = {}
    handles = []
    for index, block in enumerate(blocks):

        def grab(module, args, output, index=index):
            seen[index] = output[rows, positions].double()

        handles.append(post_attention_norm(block).register_forward_hook(grab))
    try:
        capture.run(loaded, [batch], capture.Pass(reads=[capture.Attention(lambda *_: None), writes]))
    finally:
        for handle in handles:
            handle.remove()
    for index in range(3):
        assert torch.allclose(writes.kept[index].double().sum(1), seen[index], atol=1e-4)


def test_a_norm_that_is_neither_rms_nor_layer_norm_is_refused():
    from headscope.capture.dla import FrozenNorm
    from headscope.errors import RunFailure

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))

        def forward(self, x):
            return torch.tanh(x) * self.weight

    with pytest.raises(RunFailure, match="neither an RMSNorm nor a LayerNorm"):
        FrozenNorm.of(Odd())


# --- path patching into a block's queries ----------------------------------------------------
# A replayed block reproduces the clean pass, a change at one position reaches only that
# position's query (keys and values stay clean), and S changes side by side equal S separate runs.


def _weights(loaded, layer, inputs, batch, delta, positions, only_positions=False):
    seen = {}

    def on_layer(index, attn, b, q_start):
        assert index == layer
        seen.setdefault("chunks", []).append(attn.clone())

    rerun_block(loaded, layer, inputs, batch, delta, positions, on_layer, only_positions=only_positions)
    return torch.cat(seen["chunks"], dim=2)


@pytest.mark.parametrize("build", [tiny_llama, tiny_gemma], ids=["llama", "gemma3"])
def test_replay_reproduces_the_clean_pass_and_a_change_reaches_only_its_query(build):
    loaded = build()
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    batch = _batch(vocab)
    positions = _last(batch)
    layer = 2
    clean = {}

    def on_layer(index, attn, b, q_start):
        if index == layer:
            clean.setdefault("chunks", []).append(attn.clone())

    capture.run(loaded, [batch], capture.Pass(reads=[capture.Attention(on_layer)]))
    clean_weights = torch.cat(clean["chunks"], dim=2)
    inputs = record_block_inputs(loaded, batch, [layer])[layer]
    replayed = _weights(loaded, layer, inputs, batch, None, positions)
    assert torch.allclose(replayed, clean_weights, atol=1e-6)

    delta = torch.randn(3, inputs.hidden.shape[-1], generator=torch.Generator().manual_seed(0)) * 5.0
    patched = _weights(loaded, layer, inputs, batch, delta, positions)
    for row, end in enumerate(positions.tolist()):
        others = [q for q in range(batch.input_ids.shape[1]) if q != end]
        # Every other query's row is unchanged: the keys and values were held at their clean values.
        assert torch.allclose(patched[row][:, others], clean_weights[row][:, others], atol=1e-6)
        assert not torch.allclose(patched[row][:, end], clean_weights[row][:, end], atol=1e-4)

    # Three changes side by side, as copies of the batch, equal three separate reruns.
    many = torch.stack([delta, -delta, 2 * delta])
    together = _weights(loaded, layer, inputs, batch, many, positions)
    for copy in range(3):
        alone = _weights(loaded, layer, inputs, batch, many[copy], positions)
        assert torch.allclose(together[copy * 3 : copy * 3 + 3], alone, atol=1e-5)

    # Computing only the patched query gives that query's row of the full rerun.
    rows = torch.arange(3)
    for change in (None, delta, many):
        full = _weights(loaded, layer, inputs, batch, change, positions)
        selected = _weights(loaded, layer, inputs, batch, change, positions, only_positions=True)
        copies = 1 if change is None or change.dim() == 2 else change.shape[0]
        ends = positions.repeat(copies)
        index = torch.arange(len(ends))
        assert selected.shape[2] == 1
        expected = full[index, :, ends][:, :, : selected.shape[-1]]
        assert torch.allclose(selected[:, :, 0], expected, atol=1e-5), rows
