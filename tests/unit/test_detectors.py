"""Detectors on synthetic attention with planted heads: the planted head must win, exactly."""

from __future__ import annotations

import pytest
import torch

from headscope import detectors
from headscope.capture import make_batches
from headscope.models import HeadLayout

LAYOUT = HeadLayout(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_model=32, max_positions=None)
# The registered detectors that read tokens alone (no words, arcs or positions from the analysis).
TOKEN_LEVEL = [name for name, cls in detectors.REGISTRY.items() if cls.needs == {"tokens"}]


def causal_uniform(length: int) -> torch.Tensor:
    mask = torch.ones(length, length).tril()
    return mask / mask.sum(-1, keepdim=True)


def planted(length: int, kind: str) -> torch.Tensor:
    """One [T, T] attention pattern of a known kind (rows sum to 1, causal)."""
    if kind == "uniform":
        return causal_uniform(length)
    pattern = torch.zeros(length, length)
    if kind == "previous":
        pattern[0, 0] = 1.0
        pattern[torch.arange(1, length), torch.arange(length - 1)] = 1.0
    elif kind == "sink":
        pattern[:, 0] = 1.0
    elif kind == "self":
        pattern = torch.eye(length)
    else:
        raise ValueError(kind)
    return pattern


def run_detector(name: str, batch, attn_by_layer: list[torch.Tensor]):
    detector = detectors.create([name])[0]
    detector.start(LAYOUT, n_examples=int(batch.example_index.max()) + 1)
    for layer, attn in enumerate(attn_by_layer):
        before = attn.clone()
        detector.consume(layer, attn, batch)
        assert torch.equal(attn, before), "a detector modified its input"
    (result,) = detector.results()
    return result


def plain_batch(sequences, causal=True, special_first=False):
    specials = [[special_first and i == 0 for i in range(len(s))] for s in sequences]
    return make_batches(sequences, specials, batch_size=len(sequences), pad_id=0, is_causal=causal)[0]


def stack(batch, kinds_by_layer):
    """[B, H, T, T] per layer, each head planted with its kind."""
    length = batch.input_ids.shape[1]
    layers = []
    for kinds in kinds_by_layer:
        heads = torch.stack([planted(length, kind) for kind in kinds])
        layers.append(heads[None].expand(batch.input_ids.shape[0], -1, -1, -1).contiguous())
    return layers


def test_previous_token_planted_head_ranks_first_with_score_one():
    batch = plain_batch([[5, 6, 7, 8, 9, 10, 11, 12]])
    attn = stack(batch, [["uniform", "sink", "self", "uniform"], ["uniform", "uniform", "previous", "sink"]])
    result = run_detector("previous-token", batch, attn)
    scores = result.scores()
    assert torch.argmax(scores).item() == 1 * 4 + 2  # layer 1, head 2
    assert scores[1, 2].item() == pytest.approx(1.0)
    # Uniform causal attention gives 1/(i+1) at query i; i = 1..7
    expected_uniform = sum(1 / (i + 1) for i in range(1, 8)) / 7
    assert scores[0, 0].item() == pytest.approx(expected_uniform)
    assert result.baseline() == pytest.approx(expected_uniform)
    assert result.n == 7


def test_previous_token_skips_bos():
    batch = plain_batch([[1, 6, 7, 8]], special_first=True)
    attn = stack(batch, [["previous", "sink", "self", "uniform"]] * 2)
    result = run_detector("previous-token", batch, attn)
    # Query 1 looks at BOS and is excluded: only queries 2 and 3 count.
    assert result.n == 2
    assert result.scores()[0, 0].item() == pytest.approx(1.0)
    assert result.scores()[0, 1].item() == pytest.approx(0.0)


def test_sink_planted_head():
    batch = plain_batch([[1, 2, 3, 4, 5]])
    attn = stack(batch, [["uniform", "previous", "self", "sink"], ["uniform"] * 4])
    result = run_detector("sink", batch, attn)
    scores = result.scores()
    assert torch.argmax(scores).item() == 3
    assert scores[0, 3].item() == pytest.approx(1.0)
    assert result.n == 4


def repeated_batch(segment, repeats=2, bos=True):
    seq = ([1] if bos else []) + segment * repeats
    special = ([True] if bos else []) + [False] * len(segment) * repeats
    return make_batches([seq], [special], batch_size=1, pad_id=0, is_causal=True)[0]


def copy_pattern(n_segment: int, shift: int) -> torch.Tensor:
    """[T, T] for BOS + a segment of distinct tokens + the same segment again, written by hand.

    In the second copy, query 1 + n + j attends to position 1 + j + shift: with shift 0 that is
    the earlier occurrence of its token (a duplicate-token head), with shift 1 the token that
    followed that occurrence (an induction head). Every other query attends to itself.
    Nothing here comes from headscope, so a wrong target in the detectors cannot plant itself.
    """
    length = 1 + 2 * n_segment
    pattern = torch.eye(length)
    for j in range(n_segment):
        query = 1 + n_segment + j
        pattern[query] = 0.0
        pattern[query, 1 + j + shift] = 1.0
    return pattern


def test_induction_and_duplicate_planted_heads():
    segment = [10, 11, 12, 13, 14, 15]
    batch = repeated_batch(segment)
    length = batch.input_ids.shape[1]
    assert batch.input_ids[0].tolist() == [1, *segment, *segment]
    ind, dup = copy_pattern(len(segment), shift=1), copy_pattern(len(segment), shift=0)
    uniform = causal_uniform(length)
    layer0 = torch.stack([uniform, dup, uniform, uniform])[None]
    layer1 = torch.stack([uniform, uniform, uniform, ind])[None]
    attn = [layer0, layer1]

    induction = run_detector("induction", batch, attn)
    assert torch.argmax(induction.scores()).item() == 4 + 3
    assert induction.scores()[1, 3].item() == pytest.approx(1.0)
    # Every token of the second copy has an earlier occurrence whose successor it can see.
    assert induction.n == len(segment)
    assert induction.scores()[0, 1].item() == pytest.approx(0.0)  # duplicate head != induction

    duplicate = run_detector("duplicate-token", batch, attn)
    assert torch.argmax(duplicate.scores()).item() == 1
    assert duplicate.scores()[0, 1].item() == pytest.approx(1.0)
    assert duplicate.n == len(segment)
    # Uniform baseline: one earlier occurrence among i+1 visible keys.
    queries = range(1 + len(segment), 1 + 2 * len(segment))
    assert duplicate.baseline() == pytest.approx(sum(1 / (i + 1) for i in queries) / len(segment))


def test_padding_does_not_change_scores():
    """A short row padded next to a long one scores as it does alone."""
    short, long = [5, 6, 7, 5, 6, 7], [8, 9, 10, 11, 8, 9, 10, 11, 12, 13]
    together = make_batches(
        [short, long], [[False] * 6, [False] * 10], batch_size=2, pad_id=0, is_causal=True
    )[0]
    length = together.input_ids.shape[1]
    weights = torch.rand(2, 4, length, length)
    weights = weights.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), 0.0)
    weights[0, :, :, 6:] = 0.0  # pad keys of the short row get no attention
    weights = weights / weights.sum(-1, keepdim=True)
    alone = make_batches([short], [[False] * 6], batch_size=1, pad_id=0, is_causal=True)[0]
    row = together.example_index.tolist().index(0)
    assert TOKEN_LEVEL
    for name in TOKEN_LEVEL:
        joint = run_detector(name, together, [weights, weights])
        single = run_detector(name, alone, [weights[row : row + 1, :, :6, :6]] * 2)
        assert torch.allclose(joint.sums[0], single.sums[0], atol=1e-6), name
        assert joint.counts[0] == single.counts[0], name


def test_encoder_baseline_uses_all_keys():
    batch = plain_batch([[2, 5, 6, 7, 3]], causal=False)
    length = 5
    uniform = torch.full((1, 4, length, length), 1 / length)
    result = run_detector("sink", batch, [uniform, uniform])
    assert result.baseline() == pytest.approx(1 / length)
    assert result.scores()[0, 0].item() == pytest.approx(1 / length)


def test_unknown_detector_is_rejected():
    from headscope.errors import InputError

    with pytest.raises(InputError, match="unknown detector nope"):
        detectors.create(["nope"])


def random_causal(batch, n_heads, seed):
    """Random causal rows over each row's real tokens (pads get no weight)."""
    generator = torch.Generator().manual_seed(seed)
    size, length = batch.input_ids.shape
    logits = torch.randn(size, n_heads, length, length, generator=generator)
    allowed = torch.ones(length, length, dtype=torch.bool).tril() & batch.attention_mask[:, None, None, :]
    return torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)


@pytest.mark.parametrize("name", TOKEN_LEVEL)
@pytest.mark.parametrize("rows", [1, 3, 7])
def test_chunked_delivery_equals_whole_map(name, rows):
    """Streaming capture hands query chunks whose keys stop at the chunk's end (causal)."""
    batch = plain_batch([[5, 6, 7, 5, 6, 7, 8, 5, 6], [9, 3, 9, 3, 4]], special_first=True)
    layers = [random_causal(batch, LAYOUT.n_heads, seed) for seed in range(LAYOUT.n_layers)]
    whole = run_detector(name, batch, layers)
    detector = detectors.create([name])[0]
    detector.start(LAYOUT, n_examples=2)
    length = batch.input_ids.shape[1]
    for layer, attn in enumerate(layers):
        for start in range(0, length, rows):
            stop = min(length, start + rows)
            detector.update(layer, attn[:, :, start:stop, :stop], batch, start)
        detector.end_layer(layer, batch)
    (chunked,) = detector.results()
    assert torch.allclose(chunked.sums, whole.sums, atol=1e-6)
    assert torch.equal(chunked.counts, whole.counts)
    assert torch.allclose(chunked.baseline_sums, whole.baseline_sums)
