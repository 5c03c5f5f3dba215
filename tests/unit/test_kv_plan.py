"""``kv-plan`` on the hand-built KV toy (tests/toy/kv_toy.py), whose heads are planted.

* The streaming mask inside headscope's attention equals an explicit per-head additive mask built
  here independently (eager attention), to 1e-5, on a random-weight GQA model, padded rows included.
* Every scoring method marks exactly the planted retrieval KV heads as full at 50% sparsity; making
  them streaming breaks the needle, making the others streaming does not.
* ``--out`` writes files that DuoAttention's loader logic (copied below, not imported) reads
  unchanged, and its ``sparsify_attention_heads`` reproduces headscope's plans from the scores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import kv_toy_module
from transformers import LlamaConfig, LlamaForCausalLM

import headscope as hs
from headscope import capture
from headscope.analyses import kvplan
from headscope.analyses.kvplan_present import plan_csv, write_plan_dir
from headscope.models import HeadLayout

kv = kv_toy_module()
SINK, RECENT = 4, 16


@pytest.fixture(scope="module")
def toy():
    return kv.build_kv_toy()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kvtoy")
    needles = kv.write_needles(folder / "needles.yaml")
    haystack = folder / "haystack.txt"
    haystack.write_text("\n".join(kv.haystack_lines(400)) + "\n", encoding="utf-8")
    return {"data": str(needles), "haystack": str(haystack)}


def toy_plan(toy, files, method=None, sparsity="0.5", **options):
    options = {
        "sink": SINK,
        "recent": RECENT,
        "context": "300",
        "depths": "0.25,0.5,0.75",
        "needles": 0,
        "resamples": 0,
        "sparsity": sparsity,
        **({"method": method} if method else {}),
        **files,
        **options,
    }
    result = hs.kv_plan(toy.model, toy.tokenizer, **options)
    return result, result.checks[0].value


# --- the mask -----------------------------------------------------------------------------------------


def test_streaming_mask_equals_an_explicit_per_head_mask(toy):
    """Random weights (every head attends everywhere), GQA 8 query heads over 2 KV heads; rows of
    different lengths share a padded batch in headscope and run alone through the reference."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(toy.tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    loaded = hs.load(model, toy.tokenizer)
    streamed = {(0, 1), (2, 0)}
    sink, recent = 3, 7
    rows = [torch.randint(5, len(toy.tokenizer), (n,)).tolist() for n in (40, 29, 40)]
    batches = capture.make_batches(
        rows, [[False] * len(r) for r in rows], batch_size=3, pad_id=0, is_causal=True
    )
    got: dict[tuple[int, ...], torch.Tensor] = {}

    def on_hidden(hidden, batch):
        for i, ids in enumerate(batch.input_ids.tolist()):
            n = int(batch.attention_mask[i].sum())
            got[tuple(ids[:n])] = capture.output_logits(loaded, hidden[i, :n]).cpu()

    heads = capture.StreamingHeads.of(streamed, sink, recent)
    with capture.prepared(loaded):
        reads = [capture.Attention(lambda *_: None), capture.FinalHidden(on_hidden)]
        capture.run(loaded, batches, capture.Pass(reads=reads, edits=[heads]))
    assert len(got) == 3
    for ids, logits in got.items():
        with kv.reference_streaming(model, streamed, sink, recent), torch.no_grad():
            want = model(torch.tensor([ids])).logits[0]
        with torch.no_grad():
            full = model(torch.tensor([ids])).logits[0]
        assert torch.allclose(logits, want, atol=1e-5, rtol=0), float((logits - want).abs().max())
        assert (
            float((full - want).abs().max()) > 1e-3
        )  # the mask changes the outcome: the check is not vacuous


def test_positions_count_real_tokens_only():
    batch = capture.Batch(
        input_ids=torch.zeros(2, 5, dtype=torch.long),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool),
        special=torch.zeros(2, 5, dtype=torch.bool),
        example_index=torch.arange(2),
        is_causal=True,
    )
    assert batch.positions()[1, 2:].tolist() == [0, 1, 2]
    heads = capture.StreamingHeads.of([(0, 0)], sink=1, recent=2)
    blocked = heads.blocked(0, batch, n_heads=2, n_kv_heads=2, q_start=0, stop=5, first=0, limit=5)
    # Row 0, query 4: keys 1 and 2 are neither the sink (key 0) nor among the last 2 (keys 3, 4).
    assert blocked[0, 0, 4].tolist() == [False, True, True, False, False]
    assert not blocked[:, 1].any()  # KV head 1 is not streaming
    # Row 1 is left-padded: its real query at index 4 is position 2; only real key position 0... 2.
    assert blocked[1, 0, 4].tolist() == [False, False, False, False, False]


# --- the plan on the planted toy -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["mass", "retrieval", "ablation"])
def test_plan_marks_exactly_the_planted_retrieval_heads_full(toy, files, method):
    _, plan = toy_plan(toy, files, method=method)
    (half,) = plan.sparsities
    assert half.n_streaming == 2
    assert set(half.streaming) == toy.streaming_kv
    assert set(plan.candidates) - set(half.streaming) == toy.retrieval_kv
    assert plan.full.accuracy == 1.0
    assert half.plan.accuracy == 1.0  # the planted streaming heads lose nothing
    # Random plans of the same size: 5 of the 6 two-head sets stream a retrieval head.
    assert half.random_mean("accuracy") < 0.5
    if method == "ablation":
        rows = {(r["layer"], r["kv_head"]): r for r in plan.rows}
        assert min(rows[kv]["ablation"] for kv in toy.retrieval_kv) > 1.0
        assert max(abs(rows[kv]["ablation"]) for kv in toy.streaming_kv) < 1e-3
        assert set(plan.agreement) == {"mass", "retrieval"}


def test_a_plan_scored_on_short_prompts_is_applied_at_longer_ones(toy, files):
    """--apply-context: the ranking comes from 300-token prompts, the plans and the random plans
    are checked on 600-token prompts, against full attention at 600."""
    result, plan = toy_plan(toy, files, apply_context="600")
    (half,) = plan.sparsities
    assert plan.contexts == [300] and plan.applied_contexts == [600]
    assert plan.applied_prompts == 3 * len(kv.needle_items())  # three depths
    assert {len(p.ids) for p in result.state["scored"].inputs.prompts} != {300}
    assert set(half.streaming) == toy.streaming_kv
    assert plan.full.accuracy == 1.0 and half.plan.accuracy == 1.0
    assert half.random_mean("accuracy") < 0.5
    assert plan.to_json()["applied_contexts"] == [600]


def test_apply_context_is_checked_before_the_model_runs(toy, files):
    with pytest.raises(hs.InputError, match="--apply-context 10: each context must be at least 64"):
        toy_plan(toy, files, apply_context="10")
    with pytest.raises(hs.InputError, match="--apply-context 99999 is longer than"):
        toy_plan(toy, files, apply_context="99999")


def test_streaming_the_retrieval_heads_breaks_the_needle_and_the_others_do_not(toy, files):
    result, plan = toy_plan(toy, files)
    scored = result.state["scored"]
    loaded = hs.load(toy.model, toy.tokenizer)
    with capture.prepared(loaded):
        broken = kvplan.evaluate(
            loaded,
            scored.inputs,
            capture.StreamingHeads.of(toy.retrieval_kv, SINK, RECENT),
            None,
            "",
            text=False,
        )
        kept = kvplan.evaluate(
            loaded,
            scored.inputs,
            capture.StreamingHeads.of(toy.streaming_kv, SINK, RECENT),
            None,
            "",
            text=False,
        )
    assert broken.accuracy == 0.0
    assert kept.accuracy == 1.0
    assert kept.answer_loss == pytest.approx(plan.full.answer_loss, abs=1e-5)


def test_needles_inside_the_window_are_counted_in_a_note(toy, files):
    _, plan = toy_plan(toy, files, depths="0,0.5", sparsity="0.5")
    assert any("inside the first 4 or the last 16 tokens" in note for note in plan.notes)


# --- DuoAttention's files ------------------------------------------------------------------------------


def load_attn_pattern(attn_load_dir):
    """DuoAttention's loader (duo_attn/utils.py, mit-han-lab/duo-attention), copied."""
    full_attention_heads = np.loadtxt(
        Path(attn_load_dir) / "full_attention_heads.tsv",
        dtype=float,
        delimiter="\t",
    )
    full_attention_heads = np.clip(full_attention_heads, 0, 1)
    config = json.loads((Path(attn_load_dir) / "config.json").read_text())
    sink_size = config["sink_size"]
    recent_size = config["recent_size"]
    return full_attention_heads, sink_size, recent_size


def sparsify_attention_heads(full_attention_heads, threshold=None, sparsity=None):
    """DuoAttention's thresholding (duo_attn/utils.py), copied; its tie-breaking noise kept."""
    full_attention_heads = full_attention_heads + np.random.uniform(0, 1e-6, full_attention_heads.shape)
    if sparsity is not None:
        threshold = np.quantile(full_attention_heads, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    full_attention_heads = (full_attention_heads >= threshold).astype(float)
    return full_attention_heads, 1 - np.mean(full_attention_heads)


def test_out_folder_reads_with_duoattention_loader(toy, files, tmp_path):
    _, plan = toy_plan(toy, files, sparsity="0.25,0.5,0.75")
    written = write_plan_dir(plan, tmp_path / "plan")
    assert {p.name for p in written} >= {"full_attention_heads.tsv", "config.json", "plan.csv", "curve.png"}
    scores, sink, recent = load_attn_pattern(tmp_path / "plan")
    assert (sink, recent) == (SINK, RECENT)
    assert scores.shape == (2, 2)
    for result in plan.sparsities:
        binary, _, _ = load_attn_pattern(tmp_path / "plan" / f"sparsity-{result.sparsity:g}")
        streamed = {(layer, head) for layer in range(2) for head in range(2) if binary[layer, head] == 0}
        assert streamed == set(result.streaming)
        # DuoAttention's own thresholding of the scores gives headscope's plan.
        mask, _ = sparsify_attention_heads(scores, sparsity=result.sparsity)
        assert {(layer, head) for layer, head in zip(*np.nonzero(mask == 0), strict=True)} == set(
            result.streaming
        )
    csv = plan_csv(plan).splitlines()
    assert csv[0].endswith("plan_0.25,plan_0.5,plan_0.75")
    assert len(csv) == 5
    assert (tmp_path / "plan" / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("n", [1, 2, 3, 7, 90, 101])
@pytest.mark.parametrize("sparsity", [0.0, 0.07, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_streaming_count_matches_duoattention_thresholding(n, sparsity):
    rng = np.random.default_rng(n)
    scores = rng.permutation(n) / max(1, n - 1)  # distinct, as headscope's rank scores are
    mask, _ = sparsify_attention_heads(scores, sparsity=sparsity)
    assert kvplan.n_streaming(sparsity, n) == int((mask == 0).sum())


# --- memory ---------------------------------------------------------------------------------------------


def test_kv_cache_bytes_counts_windows_and_streaming_heads():
    layout = HeadLayout(
        n_layers=3,
        n_heads=4,
        n_kv_heads=1,
        head_dim=8,
        d_model=32,
        max_positions=4096,
        local_layers=(0, 1),
        window=512,
    )
    per_token = (8 + 8) * 2  # keys and values, bfloat16
    full = kvplan.kv_cache_bytes(layout, 2048, 2)
    assert full == (512 + 512 + 2048) * per_token
    plan = kvplan.kv_cache_bytes(layout, 2048, 2, [(2, 0)], window=320)
    assert plan == (512 + 512 + 320) * per_token
    assert kvplan.candidates(layout) == [(2, 0)]
    row = kvplan.memory_row(layout, 2048, 2, [(2, 0)], 320)
    assert row["reduction"] == pytest.approx(full / plan)
    assert math.isclose(row["saved_share"], 1 - plan / full)


def test_spearman_handles_ties():
    assert kvplan.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kvplan.spearman([1, 1, 2, 2], [2, 2, 1, 1]) == pytest.approx(-1.0)
    assert math.isnan(kvplan.spearman([1, 1, 1], [1, 2, 3]))


# --- the API, the JSON, --compare -------------------------------------------------------------------------


def test_compare_applies_every_measured_score_against_the_same_random_plans(toy, files):
    result, plan = toy_plan(toy, files, compare=True, sparsity="0.25,0.5")
    assert plan.method == "retrieval"  # the default
    for one in plan.sparsities:
        assert set(one.others) == {"mass"}  # ablation was not measured
        streamed, evaluation = one.others["mass"]
        assert len(streamed) == one.n_streaming
        assert evaluation.accuracy == 1.0
    saved = json.loads(result.to_json())
    record = saved["kv_plan"]
    assert record["method"] == "retrieval"
    assert [s["sparsity"] for s in record["sparsities"]] == [0.25, 0.5]
    assert record["sparsities"][1]["other_methods"]["mass"]["accuracy"] == 1.0
    assert {tuple(kv) for kv in record["sparsities"][1]["streaming"]} == toy.streaming_kv
    again = hs.Result.from_json(saved)
    assert again.kv_plan["sparsities"][1]["plan"]["accuracy"] == 1.0
    assert any(check.get("kind") == "kv-plan" for check in again.checks)


def test_kv_plan_leaves_a_borrowed_model_as_it_was(toy, files):
    before = toy.model.config._attn_implementation
    toy_plan(toy, files)
    assert toy.model.config._attn_implementation == before
    assert not toy.model.training


def test_option_checks_come_before_the_model(toy):
    with pytest.raises(hs.InputError, match=r"--sparsity 2: 2 is outside \[0, 1\]"):
        hs.kv_plan("no-such-model", sparsity="2")
    with pytest.raises(hs.InputError, match="covers the whole --context 300"):
        hs.kv_plan("no-such-model", sink=64, recent=256, context="300")
    with pytest.raises(hs.InputError, match="method"):
        hs.kv_plan("no-such-model", method="gates")
