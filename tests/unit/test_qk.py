"""qk: every head's scores split exactly over its sources, tested on the trained toy (a previous-token
head in layer 0 feeding induction heads in layer 1), a planted version of it, tiny random models of
other families, the key-only edit, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TOY_DIR, word_tokenizer
from tiny_models import loaded_tiny, tiny_gemma, tiny_gpt2, tiny_llama
from typer.testing import CliRunner

import headscope as hs
from headscope import capture
from headscope.capture import Attention, Pass
from headscope.capture.edits import KeyOnly
from headscope.capture.sources import SourceWrites, source_names
from headscope.cli import app
from headscope.errors import InputError, Unsupported
from headscope.extend.base import RepeatSpec, model_batches, repeated_tokens
from headscope.models import load

PREVIOUS_TOKEN_HEADS = ("L0H1", "L0H2", "L0H3")  # the toy's, by ground_truth.json (0.95, 0.45, 0.62)


def shares(entry: dict, side: str) -> dict[str, float]:
    return {item["source"]: item["share"] for item in entry[side]}


@pytest.fixture(scope="module")
def toy_qk(toy):
    return hs.qk(toy, repeat_seq=2, seq_len=20, windows=5, rows=0, resamples=200, verify=2, controls=3)


def test_toy_induction_heads_take_their_keys_from_the_previous_token_heads(toy_qk):
    found = toy_qk.qk
    assert found.check["score_error"] < 1e-6 and found.check["attention_error"] < 1e-5
    for head in range(4):
        entry = found.head(1, head)
        assert entry["role"] == "induction"
        key = entry["key"][0]
        assert key["source"] == "L0H1" and key["role"] == "previous-token"
        assert key["ci_low"] is not None and key["ci_low"] > 0.3
        by_source = shares(entry, "key")
        assert sum(by_source[name] for name in PREVIOUS_TOKEN_HEADS) >= 0.8
        assert entry["query"][0]["source"] == "embed" and entry["query"][0]["share"] >= 0.7
        for side in ("key", "query"):  # a side's shares sum to 1 exactly
            # to the decomposition's own error (the margin is the model's; the parts are sources')
            assert sum(shares(entry, side).values()) == pytest.approx(1.0, abs=1e-6)
        rebuilt = {r["k"]: r["explained"] for r in entry["reconstructed"]}
        assert rebuilt[30] == pytest.approx(1.0, abs=1e-6)  # every source kept: the model itself
        assert rebuilt[0] < 0.4 < rebuilt[3]  # the top 3 sources carry the pattern; the means do not


def test_layer_0_reads_only_the_embedding(toy_qk, toy):
    assert [s.name for s in source_names(toy, 0)] == ["embed", "bias"]
    assert [s.name for s in source_names(toy, 1)] == ["embed", "L0H0", "L0H1", "L0H2", "L0H3", "mlp0", "bias"]
    for head in range(4):
        entry = toy_qk.qk.head(0, head)
        assert entry["key"][0]["source"] == "embed" and entry["key"][0]["share"] == pytest.approx(1.0)


def test_removing_the_top_key_source_moves_the_head_more_than_random_sources(toy_qk):
    (check,) = toy_qk.checks
    removals = check.value.heads
    assert len(removals) == 2
    for removal in removals:
        assert removal.layer == 1 and removal.source == "L0H1"
        assert removal.ci_low is not None and removal.ci_low > 1.5  # measured 1.9 and 2.7 (later copies)
        assert removal.move > removal.control_move
        # Averaged over the rows the protocol scores: the second copy (BOS, then 20 + 20 tokens),
        # every one of them here (rows=0), in each of the 5 evaluation windows.
        assert (
            removal.rows == "the later copies' query rows (positions 21-40)" and removal.rows_read == 5 * 20
        )
        assert removal.windows == 5


def test_tidy_rows_sum_to_one_per_head_and_side(toy_qk):
    table = toy_qk.table
    assert set(table["detector"]) == {"qk"} and set(table["relation"]) == {"key", "query"}
    sums = table.groupby(["layer", "head", "relation"])["score"].sum()
    assert (sums - 1.0).abs().max() < 1e-6
    assert set(table["role"]) == {""} and toy_qk.roles["role"].eq("").all()  # qk assigns no roles
    saved = hs.Result.from_json(toy_qk.to_json())
    assert saved.qk.head(1, 0)["key"][0]["source"] == "L0H1"


def test_planted_circuit_one_previous_token_head_feeds_the_induction_heads():
    """The toy with layer 0's other heads silenced (their output projections zeroed): L0H1 alone
    writes the previous token, and every induction head's keys come from it."""
    planted = load(str(TOY_DIR))
    with torch.no_grad():
        weight = planted.model.model.layers[0].self_attn.o_proj.weight
        for head in (0, 2, 3):
            weight[:, head * 16 : (head + 1) * 16] = 0
    found = hs.qk(planted, heads="L1H0,L1H1,L1H2,L1H3", repeat_seq=2, seq_len=20, windows=5, rows=0).qk
    for head in range(4):
        entry = found.head(1, head)
        assert entry["key"][0]["source"] == "L0H1" and entry["key"][0]["share"] >= 0.8  # measured 0.92
        assert entry["query"][0]["source"] == "embed" and entry["query"][0]["share"] >= 0.9


def _tiny_fused(config_name: str, model_name: str, stream: bool = True, **kwargs):
    """A tiny random model of a fused-projection family (3 layers, 4 heads, weights N(0, 0.2));
    ``stream``: False for a family whose attention does not go through the interface (eager maps)."""
    import transformers

    config = getattr(transformers, config_name)(vocab_size=50, **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    if not stream:
        return hs.load(model.eval(), word_tokenizer(config.vocab_size), name="tiny")
    return loaded_tiny(model.eval(), config)


def tiny_bigcode(multi_query: bool):
    return _tiny_fused(
        "GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=32, n_inner=64, n_layer=3, n_head=4,
        n_positions=64, multi_query=multi_query,
    )  # fmt: skip


def tiny_codegen():
    return _tiny_fused(
        "CodeGenConfig", "CodeGenForCausalLM", n_embd=32, n_inner=64, n_layer=3, n_head=4, rotary_dim=4,
        n_positions=64, n_ctx=64,
    )  # fmt: skip


@pytest.mark.parametrize(
    "build",
    [tiny_llama, tiny_gemma, tiny_gpt2, lambda: tiny_bigcode(True), lambda: tiny_bigcode(False), tiny_codegen],
    ids=[
        "llama-gqa-biases", "gemma3-qk-norms-mqa", "gpt2-fused-layernorm", "bigcode-fused-mqa",
        "bigcode-fused-per-head", "codegen-fused-blocks-partial-rotary",
    ],
)  # fmt: skip
def test_the_parts_sum_to_the_models_own_scores(build):
    """GQA with projection biases and random norm gains (Llama); q/k norms, post-attention norms,
    sliding windows and MQA (Gemma 3); a fused q|k|v Conv1D, LayerNorm's centring and bias, learned
    positions (GPT-2); GPT-BigCode's fused c_attn, q|k|v with one KV head or per head q, k, v;
    CodeGen's qkv_proj in 4 blocks of q, v, k slices with rotary on 4 of each head's 8 dims: the sum
    over sources is the module's own queries and keys."""
    found = hs.qk(build(), repeat_seq=2, seq_len=8, windows=2, rows=0, resamples=0).qk
    assert found.check["score_error"] < 1e-6
    assert found.check["attention_error"] < 1e-5
    entry = found.head(2, 0)
    assert sum(shares(entry, "key").values()) == pytest.approx(1.0, abs=1e-6)


def test_a_post_norm_encoder_decomposes_through_its_frozen_layernorms():
    """BERT: each block's two LayerNorms (after the attention's residual add, after the MLP's), their
    statistics frozen, are linear in every source below, so the parts still sum to the module's own
    queries and keys; the projections live in the attention's ``.self``, and ``--verify`` removes a
    source from ``self.key``'s input alone."""
    bert = _tiny_fused(
        "BertConfig", "BertModel", hidden_size=32, num_attention_heads=4, num_hidden_layers=3,
        intermediate_size=48, max_position_embeddings=64,
    )  # fmt: skip
    found = hs.qk(bert, repeat_seq=2, seq_len=8, windows=5, rows=0, resamples=0, verify=1, controls=2)
    assert found.qk.check["score_error"] < 1e-6 and found.qk.check["attention_error"] < 1e-5
    entry = found.qk.head(2, 0)
    assert {"embed", "L0H0", "L1H3", "mlp0", "mlp1", "bias"} <= {item["source"] for item in entry["key"]}
    for side in ("key", "query"):
        assert sum(shares(entry, side).values()) == pytest.approx(1.0, abs=1e-6)
    (removal,) = found.checks[0].value.heads
    assert removal.move > 0 and removal.rows_read > 0


def test_verify_on_a_fused_projection_is_refused_before_any_pass():
    with pytest.raises(InputError, match="no separate key projection"):
        hs.qk(tiny_bigcode(True), repeat_seq=2, seq_len=8, windows=2, verify=1)


def test_families_without_a_decomposition_are_refused_before_any_pass():
    falcon = _tiny_fused(
        "FalconConfig", "FalconForCausalLM", False, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        new_decoder_architecture=True, num_kv_heads=2,
    )  # fmt: skip
    with pytest.raises(Unsupported, match="FalconAttention computes attention itself"):
        hs.qk(falcon, repeat_seq=2, seq_len=8, windows=2)


def _batches(loaded, n=2):
    sequences, specials, _ = repeated_tokens(loaded, RepeatSpec(seq_len=10, repeats=2, n_seqs=n, seed=0))
    return model_batches(loaded, sequences, specials, 1)


def _layer_maps(loaded, batches, edits=()):
    maps = {}

    def keep(layer, weights, batch, q_start):
        maps.setdefault(layer, []).append(weights.clone())

    capture.run(loaded, batches, Pass(reads=[Attention(keep)], edits=list(edits)))
    return {layer: torch.cat(w, 2) for layer, w in maps.items()}


def test_key_only_edit_changes_only_that_layers_keys(toy):
    batches = _batches(toy, 1)
    clean = _layer_maps(toy, batches)
    length = batches[0].input_ids.shape[1]
    nothing = _layer_maps(toy, batches, [KeyOnly(1, lambda b: torch.zeros(1, length, 64))])
    assert torch.equal(nothing[1], clean[1])
    # Remove the whole stream from layer 1's key input: its keys are zero (RMSNorm of 0, no bias),
    # so every query spreads evenly over the keys it sees, while layer 0 is untouched.
    recorder = SourceWrites(toy, [1])
    # Every row exact in both passes (the same kernels), so the stream recorded is the edited pass's.
    capture.run(toy, batches, Pass(reads=[recorder, Attention(lambda *args: None)]))
    stream = recorder.recorded[0].x[1][None]
    emptied = _layer_maps(toy, batches, [KeyOnly(1, lambda b: stream)])
    assert torch.equal(emptied[0], clean[0])
    uniform = torch.tril(torch.ones(length, length)) / torch.arange(1, length + 1)[:, None]
    assert torch.allclose(emptied[1][0], uniform.expand(4, -1, -1), atol=1e-6)
    assert all(len(m._forward_pre_hooks) == 0 for m in toy.model.modules())


def test_key_only_needs_a_separate_key_projection():
    gpt2 = tiny_gpt2()
    with pytest.raises(InputError, match="KeyOnly"):
        _layer_maps(gpt2, _batches(gpt2, 1), [KeyOnly(1, lambda b: torch.zeros(1))])


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--heads", "L9H0"], "--heads: L9H0"),
        (["--heads", "x"], "is not a head name"),
        (["--heads", "L1H0,L1H0"], "named twice"),
        (["--repeat-seq", "1"], "at least 2 copies"),
        (["--lang", "en,en"], "named twice"),
        (["--verify", "3", "--heads", "L1H0"], "only 1 of the 1 heads explained lie above layer 0"),
        (["--verify", "1", "--heads", "L0H0,L0H1"], "only 0 of the 2 heads explained lie above layer 0"),
        (["--verify", "2", "--heads", "L0H0,L1H1"], "only 1 of the 2 heads"),
        (["--heads", "L²H0"], "is not a head name"),
        (["--heads", "L1H٣"], "is not a head name"),
    ],
)
def test_bad_options_give_one_line(args, needle):
    result = runner.invoke(app, ["qk", str(TOY_DIR), *args], catch_exceptions=False)
    assert result.exit_code == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert needle in result.stderr.replace("\n", " ")


def test_the_command_prints_each_heads_sources(tmp_path):
    out = tmp_path / "qk.csv"
    result = runner.invoke(
        app,
        ["qk", str(TOY_DIR), "--repeat-seq", "2", "--seq-len", "12", "--windows", "5", "--top", "2"]
        + ["--resamples", "200", "--csv", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    assert "keys from" in result.stdout and "L0H1 (previous-token)" in result.stdout
    assert "decomposition check" in result.stdout
    header = out.read_text().splitlines()[0]
    assert header.startswith("model,detector,relation,direction,layer,head,kv_group,score")


def test_describe_why_adds_each_heads_sources_to_its_card(toy, tmp_path):
    """describe --why: the atlas (headscope-atlas/2) carries each head's why block, validates against
    its JSON Schema, reads back, and a /1 atlas without it still reads."""
    import jsonschema

    from headscope.analyses.describe.atlas import Atlas, json_schema
    from headscope.analyses.describe.present import why_line

    rng = np.random.default_rng(1)
    lines = []
    for _ in range(8):
        segment = " ".join(f"t{i}" for i in rng.integers(0, 60, 12))
        lines.append(f"{segment} {segment}")
    text = tmp_path / "repeated.txt"
    text.write_text("\n\n".join(lines) + "\n")
    atlas = hs.describe(toy, eval_text=text, context=32, windows=5, resamples=200, why=True).atlas
    data = atlas.to_json()
    assert data["schema"] == "headscope-atlas/2" and data["why"]["check"]["score_error"] < 1e-6
    jsonschema.validate(data, json_schema())
    entry = atlas.head(1, 0)
    assert entry["why"]["key"][0]["source"] == "L0H1"  # the induction head's keys, on repeated text
    assert "why: keys from L0H1" in why_line(entry)
    back = Atlas.from_json(data)
    assert back.why == atlas.why and back.head(1, 0)["why"] == entry["why"]
    old = {
        **data,
        "schema": "headscope-atlas/1",
        "heads": [{k: v for k, v in h.items() if k != "why"} for h in data["heads"]],
    }
    old.pop("why")
    jsonschema.validate(old, json_schema())
    assert Atlas.from_json(old).why is None


def test_the_budgets_split_the_work_without_moving_a_number(monkeypatch):
    """The pull-backs in chunks of one head, each block's writes one head at a time (through Gemma 3's
    post-attention norm, whose statistic then comes from the block's total) and a pass over the
    blocks' writes per layer give the numbers of one pass over everything."""
    from headscope.analyses import qk
    from headscope.capture import sources

    loaded = tiny_gemma()
    options = dict(repeat_seq=2, seq_len=8, windows=4, rows=0, resamples=200)
    whole = hs.qk(loaded, **options).qk
    monkeypatch.setattr(sources, "PULLBACK_BYTES", 1)
    monkeypatch.setattr(sources, "BLOCK_BYTES", 1)
    monkeypatch.setattr(qk, "WAITING_BYTES", 1)
    split = hs.qk(loaded, **options).qk
    assert qk.shares_gap(whole, split) < 1e-12


def test_sources_too_large_for_memory_are_refused_before_any_pass(toy, monkeypatch):
    from headscope.capture import sources

    monkeypatch.setattr(sources, "MAX_SOURCE_BYTES", 1000)
    calls = []
    monkeypatch.setattr(capture, "run", lambda *a, **k: calls.append(a))
    with pytest.raises(InputError, match="lower --context"):
        hs.qk(toy, repeat_seq=2, seq_len=8, windows=2)
    assert not calls
