"""Edges of adapter specs and sweeps (issue 39): every case gives the right answer or is refused
before any forward pass with one line naming the file, keyword or flag.

Adapters are tiny LoRAs on the toy model (a second of peft each); sweeps run in this process
(``run_local`` is replaced by an in-process executor) so that no worker process starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TOY_DIR

import headscope as hs
from headscope.errors import HeadscopeError, InputError

peft = pytest.importorskip("peft")

FAST = dict(resamples=0, seq_len=10, n_seqs=2)


def save_adapter(folder: Path, base: Path | str, *, seed: int = 0, config: dict | None = None) -> Path:
    """A LoRA on q/v of the toy (or of the model whose config.json ``config`` gives), saved naming
    ``base`` as its base model."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if config is None:
        model = AutoModelForCausalLM.from_pretrained(TOY_DIR)
    else:
        model = LlamaForCausalLM(LlamaConfig(**config))
    torch.manual_seed(seed)
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(model, lora)
    adapted.peft_config["default"].base_model_name_or_path = str(base)
    adapted.save_pretrained(folder)
    return folder


def scores(result) -> np.ndarray:
    return result.table.sort_values(["detector", "relation", "layer", "head"]).score.to_numpy(float)


# --- adapters -----------------------------------------------------------------------------------------


def test_an_adapter_on_an_adapter_is_loaded_as_the_chain(tmp_path):
    """`stacked` was trained on `good`'s model: `good` is merged into the toy, then `stacked` is put on."""
    from transformers import AutoModelForCausalLM

    good = save_adapter(tmp_path / "good", TOY_DIR)
    stacked = save_adapter(tmp_path / "stacked", good, seed=1)
    ours = hs.induction(str(stacked), **FAST)
    assert ours.model == "model+good+stacked"
    merged = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TOY_DIR), str(good))
    by_hand = peft.PeftModel.from_pretrained(merged.merge_and_unload(), str(stacked))
    tokenizer = hs.load(str(TOY_DIR)).tokenizer
    expected = hs.induction(by_hand, tokenizer, **FAST)
    np.testing.assert_allclose(scores(ours), scores(expected), atol=1e-5)
    # Not vacuous: without the inner adapter the scores differ.
    alone = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(TOY_DIR), str(stacked))
    assert np.abs(scores(hs.induction(alone, tokenizer, **FAST)) - scores(ours)).max() > 1e-4


def test_an_adapter_config_that_is_not_an_object_names_the_file(tmp_path):
    folder = save_adapter(tmp_path / "listcfg", TOY_DIR)
    (folder / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(InputError, match=r"listcfg/adapter_config\.json: expected a JSON object"):
        hs.load(str(folder))


def test_an_adapter_whose_base_is_itself_is_refused_as_a_cycle(tmp_path):
    folder = save_adapter(tmp_path / "self", TOY_DIR)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(folder)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"self/adapter_config\.json: base_model_name_or_path leads back"):
        hs.load(str(folder))
    # Two adapters naming each other: the same refusal, naming the folder the loop comes back to.
    other = save_adapter(tmp_path / "other", folder)
    config["base_model_name_or_path"] = str(other)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="leads back to .*other"):
        hs.load(str(other))


def test_an_adapter_folder_without_weights_says_so(tmp_path):
    folder = save_adapter(tmp_path / "noweights", TOY_DIR)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(
        InputError, match=r"noweights: .*without adapter weights \(adapter_model\.safetensors"
    ):
        hs.load(str(folder))


def test_an_adapter_for_another_base_is_one_short_line(tmp_path):
    config = json.loads((TOY_DIR / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in ("architectures", "transformers_version")}
    config.update(hidden_size=32, head_dim=8, intermediate_size=64)
    folder = save_adapter(tmp_path / "wrongbase", TOY_DIR, config=config)
    with pytest.raises(HeadscopeError) as caught:
        hs.load(str(folder))
    text = str(caught.value)
    assert "\n" not in text and len(text) < 400, text
    assert "does not fit its base model" in text
    assert "layers.0.self_attn.q_proj.lora_A.default.weight is [4, 32] in the adapter and [4, 64]" in text
    assert caught.value.hint and "base_model_name_or_path" in caught.value.hint
