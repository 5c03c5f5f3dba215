"""A peft model is analysed as the adapted model: its scores, its per-head writes (DLA) and its OV
roles equal those of its merge_and_unload() copy, and it is given back exactly (adapters, their
enabled state, requires_grad)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import TOY_DIR, in_ci

import headscope as hs

# The dev extra installs peft, so CI always runs these; a bare checkout without it skips them.
peft = __import__("peft") if in_ci() else pytest.importorskip("peft")


def adapted(kind: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    torch.manual_seed(0)
    configs = {
        "lora-qv": peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        "lora-o": peft.LoraConfig(r=4, target_modules=["o_proj"], init_lora_weights=False),
        "lora-all": peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False),
        "ia3": peft.IA3Config(
            target_modules=["k_proj", "v_proj", "down_proj"],
            feedforward_modules=["down_proj"],
            init_ia3_weights=False,
        ),
    }
    return peft.get_peft_model(model, configs[kind])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOY_DIR)


def scores(result):
    return result.table.sort_values(["detector", "relation", "layer", "head"]).score.to_numpy(float)


@pytest.mark.parametrize("kind", ["lora-qv", "lora-o", "lora-all", "ia3"])
def test_a_peft_model_scores_as_its_merged_copy(kind, tokenizer):
    model = adapted(kind)
    merged = copy.deepcopy(model).merge_and_unload()
    for name, options in (("induction", dict(resamples=0)), ("weights", dict(resamples=0, tokens=300))):
        ours = hs.run(name, model, tokenizer, **options)
        theirs = hs.run(name, merged, tokenizer, **options)
        np.testing.assert_allclose(scores(ours), scores(theirs), atol=1e-5, err_msg=f"{kind} {name}")
        assert all(found["ok"] for found in ours.to_dict()["conformance"].values()), ours.to_dict()[
            "conformance"
        ]
    assert ours.model.endswith("+default")


def test_adapters_make_a_difference_the_check_can_see(tokenizer):
    """Not vacuous: the adapter moves the scores away from the base model's."""
    model = adapted("lora-all")
    with model.disable_adapter():
        base = hs.induction(model, tokenizer, resamples=0)
    ours = hs.induction(model, tokenizer, resamples=0)
    assert np.abs(scores(ours) - scores(base)).max() > 1e-3


def test_a_peft_model_is_given_back_exactly(tokenizer):
    model = adapted("lora-qv")
    model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight.requires_grad_(False)
    before = [(n, p.requires_grad) for n, p in model.named_parameters()]
    active = model.active_adapter
    hs.weights(model, tokenizer, resamples=0, tokens=200)
    hs.induction(model, tokenizer, resamples=0)
    assert [(n, p.requires_grad) for n, p in model.named_parameters()] == before
    # Adapters switched off by the user stay off during the analysis, and on again after the block
    # (peft's own context; it sets the adapters' requires_grad again on the way out).
    with model.disable_adapter():
        hs.induction(model, tokenizer, resamples=0)
        assert model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters
    assert model.active_adapter == active
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert not layer.merged and not layer.disable_adapters


def save_checkpoints(folder, steps=(10, 20)):
    """A LoRA run as a trainer leaves it: checkpoint-N folders of adapter weights, each naming the
    base model (the toy's folder) in adapter_config.json. The later one has moved further."""
    for index, step in enumerate(steps):
        model = adapted("lora-all")
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(1 + index)
        model.peft_config["default"].base_model_name_or_path = str(TOY_DIR)
        model.save_pretrained(folder / f"checkpoint-{step}")
    return folder


def test_an_adapter_folder_is_a_model_spec(tmp_path, tokenizer):
    run = save_checkpoints(tmp_path / "run")
    from_folder = hs.induction(str(run / "checkpoint-10"), resamples=0)
    from_object = hs.induction(adapted("lora-all"), tokenizer, resamples=0)
    np.testing.assert_allclose(scores(from_folder), scores(from_object), atol=1e-6)
    assert from_folder.model == "model+checkpoint-10"


def test_base_against_adapter_and_a_sweep_over_adapter_checkpoints(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    run = save_checkpoints(tmp_path / "run")
    base = hs.induction(AutoModelForCausalLM.from_pretrained(TOY_DIR), tokenizer, resamples=0)
    tuned = hs.induction(str(run / "checkpoint-20"), resamples=0)
    changed = hs.compare(base, tuned)
    (table,) = [t for t in changed.tables if t.detector == "induction"]
    assert table.n_common == 8 and abs(table.mean_delta) > 1e-3
    assert changed.joined["delta"].abs().max() > 1e-3
    swept = hs.sweep([str(run)], tmp_path / "store", analyses="induction", resamples=0, seq_len=20)
    assert not swept.failed
    steps = sorted(swept.table["step"].dropna().unique().tolist())
    assert steps == [10, 20]
    last = swept.table[(swept.table["step"] == 20) & (swept.table["detector"] == "induction")]
    direct = hs.induction(str(run / "checkpoint-20"), resamples=0, seq_len=20).table
    direct = direct[direct.detector == "induction"].sort_values(["layer", "head"])
    np.testing.assert_allclose(
        last.sort_values(["layer", "head"]).score.to_numpy(float), direct.score.to_numpy(float), atol=1e-6
    )
