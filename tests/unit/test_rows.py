"""Query-selective capture: only the rows a reader declares get exact weights; the rest run fused.

* On the trained toy (tests/toy/model/), a detector that reads only each sequence's last token gets
  exactly those rows, one per row of the batch, and no others: the other rows' weights are never
  computed (counted per layer). Its scores equal the full-map path's.
* A pass that reads no row (losses, hidden states) runs every layer fused and gives the same
  numbers; so do a sliding window past padding, streaming KV heads, and a soft-capped model (whose
  unread rows stay exact, since SDPA has no soft-cap).
* On the hand-built KV toy (planted retrieval heads), ``hs.retrieval`` computes weights at the
  answer positions only, and its table equals the full-map path's.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import kv_toy_module
from tiny_models import tiny_gemma

import headscope as hs
from headscope import capture
from headscope.capture import rows
from headscope.detectors.base import Detector
from headscope.extend.base import score_batches

kv = kv_toy_module()


def test_spans_and_complement():
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, [1, 2, 3, 7]] = True
    mask[1, [3, 9]] = True
    assert rows.spans(mask) == [(1, 4), (7, 8), (9, 10)]
    assert rows.complement([(1, 4), (7, 8), (9, 10)], 10) == [(0, 1), (4, 7), (8, 9)]
    assert rows.spans(torch.zeros(1, 4, dtype=torch.bool)) == []
    assert rows.complement([], 4) == [(0, 4)]
    batch = capture.make_batches(
        [[1, 2, 3], [4, 5]], [[False] * 3, [False] * 2], batch_size=2, pad_id=0, is_causal=True
    )[0]
    assert rows.last_row(batch).nonzero().tolist() == [[0, 1], [1, 2]]  # sorted by length: [4, 5] first
    assert rows.union([rows.last_row, rows.every_row])(batch) is None
    assert rows.union([rows.no_row])(batch).sum() == 0


def _toy_batches(loaded, lengths=(9, 7, 12)):
    gen = torch.Generator().manual_seed(5)
    vocab = loaded.model.get_input_embeddings().num_embeddings
    seqs = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in lengths]
    return capture.make_batches(seqs, [[False] * n for n in lengths], batch_size=3, pad_id=0, is_causal=True)


def _last_to_first():
    def targets(batch):
        last = batch.attention_mask.sum(1) - 1
        found = torch.arange(batch.input_ids.shape[0])
        return found, last, torch.zeros_like(last)

    return hs.TargetDetector("last-to-first", targets=targets)


class LastRowMass(Detector):
    """Dense: the last token's attention on key 0, read from whole rows (declares the last row)."""

    name = "last-row-mass"
    summary = "test"

    def reads(self, batch):
        return rows.last_row(batch)

    def update(self, layer, attn, batch, q_start=0):
        last = batch.attention_mask.sum(1) - 1
        inside = (last >= q_start) & (last < q_start + attn.shape[2])
        picked = torch.where(inside)[0]
        mass = torch.zeros(attn.shape[0], attn.shape[1], dtype=attn.dtype)
        mass[picked] = attn[picked, :, last[picked] - q_start, 0]
        self._accumulate(layer, batch, mass, inside.to(attn.dtype), torch.zeros(attn.shape[0]))


def _spied(detector, seen):
    update, update_pairs = detector.update, detector.update_pairs

    def spy(layer, attn, batch, q_start=0):
        seen.append(("rows", layer, q_start, attn.shape[2]))
        update(layer, attn, batch, q_start)

    def spy_pairs(layer, found, batch):
        seen.append(("pairs", layer, found.weights.shape))
        update_pairs(layer, found, batch)

    detector.update, detector.update_pairs = spy, spy_pairs
    return detector


def test_a_detector_that_reads_the_last_row_gets_only_the_last_rows(toy):
    batches = _toy_batches(toy)
    layers = toy.layout.n_layers
    seen = []
    with rows.counting() as counts:
        (selective,) = score_batches(toy, batches, [_spied(LastRowMass(), seen)], 3, "toy")
    # Lengths 9, 7, 12: the last rows are 6, 8 and 11, each delivered alone; no other row's weights
    # were computed in any layer, and the other 9 rows went through the fused kernel.
    assert sorted({(q, c) for _, _, q, c in seen}) == [(6, 1), (8, 1), (11, 1)]
    assert counts.exact_rows == dict.fromkeys(range(layers), 3)
    assert counts.fused_rows == dict.fromkeys(range(layers), 9)
    seen.clear()
    with rows.full_maps(), rows.counting() as full_counts:
        (full,) = score_batches(toy, batches, [_spied(LastRowMass(), seen)], 3, "toy")
    assert full_counts.exact_rows == dict.fromkeys(range(layers), 12) and not full_counts.fused_rows
    assert {(q, c) for _, _, q, c in seen} == {(0, 12)}
    assert torch.allclose(selective.scores(), full.scores(), atol=1e-6, rtol=0)
    assert float(selective.scores().max()) > 0.05  # something was really measured


def test_a_target_detector_gets_its_pairs_and_no_row_is_computed(toy):
    """The same question as a TargetDetector (last token to key 0): it reads three pairs a layer.
    Every row runs fused; the weights at the pairs come from the kernel's log-sum-exp."""
    batches = _toy_batches(toy)
    layers = toy.layout.n_layers
    seen = []
    with rows.counting() as counts:
        (selective,) = score_batches(toy, batches, [_spied(_last_to_first(), seen)], 3, "toy")
    assert [s[0] for s in seen] == ["pairs"] * layers  # one call per layer, never a row chunk
    assert all(s[2] == (3, toy.layout.n_heads) for s in seen)
    assert not counts.exact_rows and counts.pairs == dict.fromkeys(range(layers), 3)
    assert counts.fused_rows == dict.fromkeys(range(layers), 12)
    with rows.full_maps():
        (full,) = score_batches(toy, batches, [_last_to_first()], 3, "toy")
    (dense,) = score_batches(toy, batches, [LastRowMass()], 3, "toy")
    assert torch.allclose(selective.scores(), full.scores(), atol=1e-6, rtol=0)
    assert torch.allclose(selective.scores(), dense.scores(), atol=1e-6, rtol=0)
    assert torch.allclose(selective.baseline_by_layer(), full.baseline_by_layer(), atol=1e-9)


def test_token_detectors_on_pairs_equal_full_maps(toy):
    """previous-token, duplicate-token, induction and sink all read pairs: a scan of them runs
    every layer fused, and every score and reference equals the full-map path's."""
    from headscope import detectors

    batches = _toy_batches(toy, lengths=(24, 17, 30))
    names = ["previous-token", "duplicate-token", "induction", "sink"]
    with rows.counting() as counts:
        selective = score_batches(toy, batches, detectors.create(names), 3, "toy")
    assert not counts.exact_rows and counts.total_pairs > 0
    with rows.full_maps():
        full = score_batches(toy, batches, detectors.create(names), 3, "toy")
    for a, b in zip(selective, full, strict=True):
        assert torch.allclose(a.scores(), b.scores(), atol=1e-6, rtol=0), a.detector
        assert torch.allclose(a.baseline_by_layer(), b.baseline_by_layer(), atol=1e-9), a.detector
        assert torch.equal(a.counts, b.counts), a.detector


def test_the_induction_detector_reads_the_repeated_half_and_scores_the_same(toy):
    """Induction reads its targets as pairs: every row runs fused, and the score is the same."""
    result = {}
    for path in ("selective", "full"):
        with rows.full_maps() if path == "full" else torch.no_grad(), rows.counting() as counts:
            out = hs.induction(toy.model, toy.tokenizer, seq_len=20, n_seqs=4, resamples=0)
        result[path] = (out.scores("induction"), counts)
    assert result["selective"][1].total_fused > 0 and not result["full"][1].total_fused
    assert abs(result["selective"][0] - result["full"][0]).max() <= 1e-6


def test_a_pass_nobody_reads_runs_fused_with_the_same_losses(toy):
    batches = _toy_batches(toy)
    losses = {}
    for path in ("selective", "full"):
        got = []
        with rows.full_maps() if path == "full" else torch.no_grad(), rows.counting() as counts:
            losses_read = capture.TokenLosses(lambda loss, b, got=got: got.append(loss.clone()))
            capture.run(toy, batches, capture.Pass(reads=[losses_read]))
        losses[path] = (got, counts)
    assert losses["selective"][1].total_exact == 0 and losses["full"][1].total_fused == 0
    for a, b in zip(losses["selective"][0], losses["full"][0], strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def _hidden(loaded, batches, **kwargs):
    got = []
    hidden = capture.FinalHidden(lambda h, b: got.append(h.clone()))
    capture.run(loaded, batches, capture.Pass(reads=[hidden], **kwargs))
    return got


def test_fused_rows_keep_the_window_padding_and_streaming_heads():
    """Tiny Gemma 3 (window 4), rows of 3 to 12 tokens in one padded batch: a padded query far
    past the window sees no key; it gets the same output on both paths, and so does every other."""
    loaded = tiny_gemma()
    batches = _toy_batches(loaded, lengths=(12, 3, 9))
    streaming = capture.StreamingHeads.of([(2, 0)], sink=1, recent=2)
    for kwargs in ({}, {"edits": [streaming]}):
        selective = _hidden(loaded, batches, **kwargs)
        with rows.full_maps():
            full = _hidden(loaded, batches, **kwargs)
        for a, b in zip(selective, full, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=0), kwargs
    # The streaming heads change the outputs (so the comparison above saw them).
    plain = _hidden(loaded, batches)
    assert not torch.allclose(plain[0], _hidden(loaded, batches, edits=[streaming])[0], atol=1e-4)


def test_soft_capped_rows_stay_exact():
    """Gemma 2 soft-caps its attention logits; SDPA cannot, so no row runs fused there."""
    from conftest import word_tokenizer
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        attn_logit_softcapping=5.0,
        sliding_window=4,
    )
    torch.manual_seed(0)
    loaded = hs.load(Gemma2ForCausalLM(config).eval(), word_tokenizer(40), capture="stream", name="g2")
    batches = _toy_batches(loaded, lengths=(8, 5, 6))
    with rows.counting() as counts:
        selective = _hidden(loaded, batches)
    assert counts.total_fused == 0 and counts.total_exact > 0
    with rows.full_maps():
        full = _hidden(loaded, batches)
    assert torch.allclose(selective[0], full[0], atol=1e-6, rtol=0)


def test_retrieval_on_the_kv_toy_reads_only_the_answer_rows(tmp_path):
    toy = kv.build_kv_toy()
    needles = kv.write_needles(tmp_path / "needles.yaml")
    haystack = tmp_path / "haystack.txt"
    haystack.write_text("\n".join(kv.haystack_lines(400)) + "\n", encoding="utf-8")
    options = dict(data=str(needles), haystack=str(haystack), context="300", depths="0.5", resamples=0)
    capture.checks.check(hs.load(toy.model, toy.tokenizer), "maps")  # once per model: not counted below
    with rows.counting() as counts:
        selective = hs.retrieval(toy.model, toy.tokenizer, **options)
    with rows.full_maps(), rows.counting() as full_counts:
        full = hs.retrieval(toy.model, toy.tokenizer, **options)
    # Every row of every prompt exact on the full path; a handful of answer rows on the other.
    assert counts.total_exact + counts.total_fused == full_counts.total_exact
    assert 0 < counts.total_exact < full_counts.total_exact / 20
    pd.testing.assert_frame_equal(selective.table, full.table, check_exact=False, atol=1e-6, rtol=0)
    pd.testing.assert_frame_equal(selective.roles, full.roles)
    top = selective.table.sort_values("score", ascending=False).iloc[0]
    assert (int(top["layer"]), int(top["head"])) in {kv.HEAD_A, kv.HEAD_B}


@pytest.mark.parametrize("reads", [rows.every_row, rows.no_row])
def test_eager_capture_ignores_the_declaration(toy_eager, reads):
    """Eager capture has the model's own maps: every layer still arrives whole."""
    seen = []
    attention = capture.Attention(lambda layer, w, b, q: seen.append(w.shape[2]), rows=reads)
    capture.run(toy_eager, _toy_batches(toy_eager), capture.Pass(reads=[attention]))
    assert seen and set(seen) == {12}
