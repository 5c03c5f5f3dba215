"""IOI's S-inhibition path patching reads the receivers' block inputs and the senders' clean writes
from the main clean pass: the same table as a second clean pass per batch would give, and the
replays compute the attention weights only (no MLP)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from headscope import capture
from headscope.analyses import ioi as ioi_module
from headscope.capture.patching import record_block_inputs, rerun_block
from headscope.data.circuits import IOIItem, IOISet
from headscope.models.anatomy import blocks

RECEIVERS = [(1, 0), (2, 1), (2, 3), (0, 2)]  # a receiver in layer 0 has no sender: no replay


def _tiny_set() -> IOISet:
    # Words w3..w9 fill the templates; names are w20..w25 (the word tokenizer makes each one token).
    texts = [
        ("w3 w20 w4 w21 w5 w6 w21 w7 w8", "w20", "w21"),
        ("w3 w22 w4 w23 w5 w6 w7 w23 w9 w8", "w22", "w23"),
        ("w9 w24 w4 w25 w5 w25 w7 w8", "w24", "w25"),
        ("w3 w21 w4 w20 w5 w6 w20 w7 w8 w9 w6", "w21", "w20"),
        ("w5 w23 w4 w24 w5 w6 w24 w7", "w23", "w24"),
    ]
    items = [IOIItem(f"t{i}", text, io, s, source=f"tiny:{i}") for i, (text, io, s) in enumerate(texts)]
    return IOISet("tiny", items, "tiny.yaml")


@pytest.fixture(scope="module")
def patched(request):
    """ioi() on a tiny random Llama with the name movers fixed to RECEIVERS, counting second passes."""
    loaded = tiny_llama(sharp=True)
    calls = []
    patch = pytest.MonkeyPatch()
    patch.setattr(ioi_module, "_name_movers", lambda table, data, role: list(RECEIVERS))
    real = ioi_module.record_block_inputs
    patch.setattr(ioi_module, "record_block_inputs", lambda *a, **k: calls.append(1) or real(*a, **k))
    try:
        report, _, batches = ioi_module.ioi(loaded, _tiny_set(), batch_size=2, n_resamples=0)
    finally:
        patch.undo()
    return loaded, report, batches, calls


def test_s_inhibition_from_the_main_pass_equals_a_second_clean_pass(patched):
    loaded, report, batches, calls = patched
    assert calls == []  # no second clean pass: the main pass kept what the replays need
    (one_pass,) = [r for r in report.results if r.relation == "s-inhibition"]
    n = sum(len(b.meta) for b in batches["clean"])
    two_pass = ioi_module.s_inhibition(
        loaded, batches["clean"], batches["corrupt"], RECEIVERS, n, "tiny", recorded=None
    )
    assert one_pass.sums.abs().max() > 1e-3  # the patching moved something
    torch.testing.assert_close(one_pass.sums, two_pass.sums, rtol=0, atol=1e-6)
    torch.testing.assert_close(one_pass.counts, two_pass.counts, rtol=0, atol=0)
    # Senders reach only later receivers: the last receiver layer sends to none.
    assert one_pass.sums[:, 2].abs().max() == 0


def test_receiver_preference_is_attention_to_io_minus_s1_and_s2_at_end(patched):
    """The vectorised preference equals the sum over rows, heads and name tokens read from a plain pass."""
    loaded, _, batches, _ = patched
    batch = batches["clean"][1]
    layer, heads = 2, [1, 3]
    ends = ioi_module._ends(batch)
    expected = torch.zeros(len(ends), dtype=torch.float64)

    def on_layer(index, attn, b, q_start):
        if index != layer:
            return
        for row, meta in enumerate(b.meta):
            end = meta["end"] - q_start
            if not 0 <= end < attn.shape[2]:
                continue
            weights = attn[row, heads, end].double()
            t = meta["targets"]
            expected[row] += float(
                weights[:, t["io"]].sum() - weights[:, t["s1"]].sum() - weights[:, t["s2"]].sum()
            )

    capture.run(loaded, [batch], capture.Pass(reads=[capture.Attention(on_layer)]))
    inputs = record_block_inputs(loaded, batch, [layer])[layer]
    signs = ioi_module._preference_signs(batch)
    found = ioi_module._receiver_preference(loaded, layer, heads, inputs, batch, signs, None)
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-6)


def test_a_replay_ends_after_the_attention_weights(patched):
    loaded, _, batches, _ = patched
    batch = batches["clean"][0]
    layer = 2
    inputs = record_block_inputs(loaded, batch, [layer])[layer]
    block = blocks(loaded.model)[layer]
    ran = []
    handles = [
        block.mlp.register_forward_hook(lambda *_: ran.append("mlp")),
        block.self_attn.o_proj.register_forward_hook(lambda *_: ran.append("o_proj")),
    ]
    seen = []
    try:
        rerun_block(
            loaded,
            layer,
            inputs,
            batch,
            None,
            ioi_module._ends(batch),
            lambda i, attn, b, q: seen.append(attn.shape),
            only_positions=True,
        )
    finally:
        for handle in handles:
            handle.remove()
    assert ran == [] and len(seen) == 1 and seen[0][2] == 1


def test_logits_of_chosen_tokens_are_those_of_the_whole_vocabulary(patched):
    """IOI's logit difference reads two logits per row: the same numbers as the full LM head's."""
    from headscope.capture.logits import output_logits, output_logits_of

    loaded = patched[0]
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(1)) * 3.0
    tokens = torch.tensor([[1, 7], [20, 21], [49, 0], [3, 3], [10, 40]])
    full = output_logits(loaded, hidden)
    torch.testing.assert_close(
        output_logits_of(loaded, hidden, tokens), full.gather(-1, tokens), rtol=1e-6, atol=1e-5
    )
    loaded.model.config.final_logit_softcapping = 2.0  # Gemma 2's final soft-cap, applied to both
    try:
        capped = output_logits(loaded, hidden)
        assert not torch.allclose(capped, full)
        torch.testing.assert_close(
            output_logits_of(loaded, hidden, tokens), capped.gather(-1, tokens), rtol=1e-6, atol=1e-5
        )
    finally:
        loaded.model.config.final_logit_softcapping = None


def test_the_ioi_attention_table_is_the_attention_from_end_to_each_name(patched):
    """IOIAttentionDetector.update reads every row's END query in one product: per head, the weight
    on each name's tokens, and as reference the share of visible keys those tokens are."""
    from headscope.detectors.circuits import IOI_TARGETS, IOIAttentionDetector

    loaded, _, batches, _ = patched
    layout = loaded.layout
    n = sum(len(b.meta) for b in batches["clean"])
    detector = IOIAttentionDetector()
    detector.start(layout, n)
    expected = torch.zeros(len(IOI_TARGETS), n, layout.n_layers, layout.n_heads, dtype=torch.float64)
    base = torch.zeros(len(IOI_TARGETS), n, layout.n_layers, dtype=torch.float64)

    def on_layer(layer, attn, b, q_start):
        detector.update(layer, attn, b, q_start)
        for row, meta in enumerate(b.meta):
            end = meta["end"] - q_start
            if not 0 <= end < attn.shape[2]:
                continue
            example = int(b.example_index[row])
            for t, target in enumerate(IOI_TARGETS):
                positions = meta["targets"][target]
                expected[t, example, layer] += attn[row, :, end][:, positions].double().sum(-1)
                base[t, example, layer] += len(positions) / (meta["end"] + 1)  # causal, padded on the right

    capture.run(loaded, batches["clean"], capture.Pass(reads=[capture.Attention(on_layer)]))
    results = detector.results("tiny")
    for t, result in enumerate(results):
        torch.testing.assert_close(result.sums, expected[t], rtol=0, atol=1e-6)
        torch.testing.assert_close(result.baseline_sums, base[t], rtol=0, atol=1e-12)
        assert result.counts.tolist() == [1.0] * n
