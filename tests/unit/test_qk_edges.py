"""qk at its edges (issue 55): a margin that float rounding cannot resolve gives no share, never a
ratio of noise; the causal check's moves cannot go negative and a ratio to a move within rounding
is no ratio; layer 0 and too many heads are refused before any pass; a bias top source is removed
like any other; the model's precision and a LoRA adapter are handled for what they are."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import TOY_DIR
from tiny_models import tiny_llama

import headscope as hs
from headscope.analyses.qk import HeadSums, _unresolved, shares_gap, sources_table
from headscope.errors import InputError, Unsupported
from headscope.models import load

peft = pytest.importorskip("peft")

QUICK = dict(repeat_seq=2, seq_len=20, windows=5, rows=0)


def _toy(edit) -> object:
    loaded = load(str(TOY_DIR))
    with torch.no_grad():
        edit(loaded.model.model.layers)
    return loaded


@pytest.fixture(scope="module")
def silenced():
    """The toy with L1H0's queries zeroed and L1H1's scaled by 1e-9 (layer 1's W_Q rows 0-15, 16-31)."""

    def edit(layers):
        layers[1].self_attn.q_proj.weight[0:16] = 0
        layers[1].self_attn.q_proj.weight[16:32] *= 1e-9

    return hs.qk(_toy(edit), heads="L1H0,L1H1,L1H2", resamples=200, **QUICK)


def test_a_margin_within_rounding_gives_no_share_and_says_why(silenced):
    found = silenced.qk
    zero, tiny, real = (found.head(1, h) for h in range(3))
    # Before: every share of L1H0 printed 0.0 (the sides summed to 0) and L1H1's were ratios of
    # float noise (+-1e14 on the margin of -2.3e-18 the float32 attention gave).
    assert "scores are 0" in zero["unresolved"]
    assert "not above 100x its float rounding" in tiny["unresolved"]
    for entry in (zero, tiny):
        assert entry["margin"] <= entry["resolution"]
        for side in ("key", "query"):
            assert all(item["share"] is None and item["ci_low"] is None for item in entry[side])
        assert "pairs" not in entry and "reconstructed" not in entry
    assert real["unresolved"] is None and real["margin"] > 1000 * real["resolution"]
    assert sum(item["share"] for item in real["key"]) == pytest.approx(1.0, abs=1e-6)
    assert any("2 heads without shares (L1H0, L1H1)" in note for note in found.notes)
    # the CSV leaves the shares empty and says why; the JSON reads back
    sources = sources_table("toy", found.heads)
    of = sources[sources["head"] == 1]
    assert of["share"].isna().all() and of["note"].str.contains("float rounding").all()
    assert sources[sources["head"] == 2]["note"].eq("").all()
    assert hs.Result.from_json(silenced.to_json()).qk.head(1, 1)["unresolved"] == tiny["unresolved"]


def test_rows_that_see_one_key_give_no_share():
    sums = HeadSums(1, 0, 0, [], margin=[0.0, 0.0], rows=[3, 3], rounding=[1e-9, 1e-9], choosing=[0, 0])
    assert "more than one key" in _unresolved(sums)
    sums.choosing, sums.margin = [2, 2], [1.0, 1.0]
    assert _unresolved(sums) is None


def test_the_terminal_shows_the_reason_not_a_share(silenced):
    from rich.console import Console

    from headscope.analyses.qk_present import html_section, print_qk

    console = Console(record=True, width=200)
    print_qk(silenced, console, 5)
    text = console.export_text()
    assert "no shares: its scores are 0" in text and "nan" not in text.lower()
    assert "no shares" in html_section(silenced.qk)


@pytest.fixture(scope="module")
def planted():
    """L0H1 the only writer below layer 1 (the other heads' outputs and the MLP zeroed): random
    sources remove nothing."""

    def edit(layers):
        weight = layers[0].self_attn.o_proj.weight
        for head in (0, 2, 3):
            weight[:, head * 16 : (head + 1) * 16] = 0
        layers[0].mlp.down_proj.weight.zero_()

    return _toy(edit)


def test_a_ratio_to_a_move_within_rounding_is_no_ratio(planted):
    found = hs.qk(planted, heads="L1H0,L1H1", verify=2, controls=3, resamples=200, **QUICK)
    for removal in found.checks[0].value.heads:
        assert removal.source == "L0H1" and removal.move > 0.1
        # before: 1 - sum min(A, A') gave -1e-8 for the controls and a ratio of 1e7 or more
        assert 0.0 <= removal.control_move < 1e-5
        assert removal.ratio is None and removal.ci_low is None
        assert "within float rounding" in removal.note


def test_verify_refuses_more_heads_than_lie_above_layer_0_before_any_pass(planted, monkeypatch):
    import headscope.analyses.qk as qk_module

    found = hs.qk(planted, heads="L0H0,L0H1,L1H0", resamples=0, **QUICK)

    def no_pass(*args, **kwargs):
        raise AssertionError("a pass ran")

    monkeypatch.setattr(qk_module, "_attention_rows", no_pass)
    with pytest.raises(InputError, match="only 1 of the 3 heads explained lie above layer 0"):
        found.verify(k=2)  # before: verified one head without a word
    with pytest.raises(InputError, match="only 0 of the 2 heads"):
        hs.qk(planted, heads="L0H0,L0H1", verify=1, resamples=0, **QUICK)


def test_a_bias_top_key_source_is_removed_like_any_other():
    """Layer 0's output bias made large: layer 2's keys come mostly from the bias (before: IndexError)."""
    loaded = tiny_llama()
    with torch.no_grad():
        loaded.model.model.layers[0].self_attn.o_proj.bias.mul_(40.0)
        loaded.model.model.layers[1].self_attn.o_proj.bias.mul_(40.0)
    found = hs.qk(loaded, heads="L2H0,L2H1,L2H2,L2H3", resamples=0, **QUICK)
    biased = [e for e in found.qk.heads if e["key"][0]["source"] == "bias"]
    assert biased, [e["key"][0] for e in found.qk.heads]
    removals = found.verify(k=4)[0].value.heads
    by_head = {(r.layer, r.head): r for r in removals}
    for entry in biased:
        removal = by_head[(entry["layer"], entry["head"])]
        assert removal.source == "bias" and removal.move > 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_model_is_refused_for_its_precision_before_any_pass(dtype):
    loaded = tiny_llama()
    loaded.model.to(dtype)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(Unsupported, match=f"runs in {name}.*load it in float32"):
        hs.qk(loaded, resamples=0, **QUICK)


def test_a_lora_model_decomposes_as_its_merged_copy():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    config = peft.LoraConfig(
        r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    adapted = peft.get_peft_model(model, config)
    merged = copy.deepcopy(adapted).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(TOY_DIR)
    # before: refused as "this layout is not one of them"
    ours = hs.qk(adapted, tokenizer, heads="L1H0,L1H2", resamples=0, **QUICK).qk
    theirs = hs.qk(merged, tokenizer, heads="L1H0,L1H2", resamples=0, **QUICK).qk
    assert shares_gap(ours, theirs) < 1e-6
    assert np.isfinite([item["share"] for item in ours.head(1, 0)["key"]]).all()


@pytest.fixture
def no_pass(monkeypatch):
    """Any forward pass (the model's own checks included) fails the test: a refusal must come first."""
    from headscope.capture import checks

    def refuse(*args, **kwargs):
        raise AssertionError("a forward pass ran before the refusal")

    monkeypatch.setattr(checks, "require", refuse)


def test_a_short_eval_text_is_refused_before_any_pass(toy, tmp_path, no_pass):
    text = tmp_path / "one.txt"
    text.write_text("t1 t2 t3 t4 t5 t6\n")
    # before: refused after the model's own checks had run their passes
    with pytest.raises(InputError, match="1 window of text to evaluate on"):
        hs.qk(toy, eval_text=text, context=32, resamples=0)
    with pytest.raises(InputError, match="1 window of text to evaluate on"):
        hs.describe(toy, eval_text=text, context=32, resamples=0)


def test_describe_why_on_a_family_qk_refuses_is_refused_before_any_pass(no_pass):
    from conftest import word_tokenizer
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(vocab_size=50, hidden_size=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = BloomForCausalLM(config).eval()
    bloom = hs.load(model, word_tokenizer(50), capture="eager", name="bloom")
    # before: describe's own passes ran first
    with pytest.raises(Unsupported, match="describe --why: .*ALiBi"):
        hs.describe(bloom, why=True, resamples=0, context=32)


def test_verify_rows_outside_the_later_copies_are_refused_before_any_pass(toy, monkeypatch):
    """--rows 1: one sampled row per window; a seed whose rows all fall in the first copy is refused
    up front, and the check agrees with what the verify pass would read for every seed tried."""
    from headscope.analyses.qk import QK, QKOptions, _check_verify_rows

    refused = []
    for seed in range(40):
        options = QKOptions(repeat_seq=2, seq_len=20, windows=2, rows=1, seed=seed, verify=1, resamples=0)
        try:
            _check_verify_rows(toy, options)
        except InputError as error:
            assert "no sampled query row falls in the later copies (positions 21-40)" in str(error)
            refused.append(seed)
    assert refused and len(refused) < 40  # some seeds leave a row there, some do not
    seed = refused[0]
    from headscope.capture import checks

    monkeypatch.setattr(checks, "require", lambda *a, **k: (_ for _ in ()).throw(AssertionError("a pass")))
    with pytest.raises(InputError, match="later copies"):
        hs.qk(toy, repeat_seq=2, seq_len=20, windows=2, rows=1, seed=seed, verify=1, resamples=0)
    monkeypatch.undo()
    # a seed the check lets through verifies (the pass finds rows in the later copies)
    kept = next(s for s in range(40) if s not in refused)
    found = hs.qk(
        toy, heads="L1H0", repeat_seq=2, seq_len=20, windows=2, rows=1, seed=kept, verify=1, resamples=0
    )
    assert found.checks[0].value.heads[0].rows_read > 0
    assert QK  # the analysis whose check_loaded calls it


def test_a_qk_block_read_on_its_own_is_checked(silenced):
    from headscope.analyses.qk import QKResult

    block = silenced.qk.to_json()
    assert (
        QKResult.from_json(block).head(1, 2)["key"][0]["source"] == silenced.qk.head(1, 2)["key"][0]["source"]
    )
    del block["heads"][2]["key"][0]["share"]  # before: read without a word
    with pytest.raises(InputError, match=r"saved\.json: qk\.heads\[2\]\.key\[0\]"):
        QKResult.from_json(block, "saved.json")
