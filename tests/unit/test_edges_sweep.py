"""Edges of adapter specs and sweeps (issue 39): every case gives the right answer or is refused
before any forward pass with one line naming the file, keyword or flag.

Adapters are tiny LoRAs on the toy model (a second of peft each); sweeps run in this process
(``run_local`` is replaced by an in-process executor) so that no worker process starts."""

from __future__ import annotations

import json
import shutil
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


def test_an_adapter_folder_with_its_bases_config_beside_it_is_still_the_adapter(tmp_path):
    """Some trainers save the base's config.json and tokenizer beside the adapter: without a full
    model's weights the folder is the adapter (it was "no file named model.safetensors")."""
    good = save_adapter(tmp_path / "good", TOY_DIR)
    beside = tmp_path / "beside"
    shutil.copytree(good, beside)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOY_DIR / name, beside / name)
    ours = hs.induction(str(beside), **FAST)
    assert ours.model == "model+beside"
    np.testing.assert_allclose(scores(ours), scores(hs.induction(str(good), **FAST)), atol=1e-6)


def test_a_prompt_tuning_adapter_is_refused_not_read_as_its_base(tmp_path):
    """Its virtual tokens live in peft's forward: the adapted model's layers are the base's, and the
    numbers were the base model's under the adapter's name."""
    from transformers import AutoModelForCausalLM

    adapted = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(TOY_DIR),
        peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    )
    adapted.peft_config["default"].base_model_name_or_path = str(TOY_DIR)
    adapted.save_pretrained(tmp_path / "prompt")
    with pytest.raises(InputError, match="a PROMPT_TUNING adapter prepends learned prompts"):
        hs.load(str(tmp_path / "prompt"))


def test_an_unknown_peft_type_names_the_config(tmp_path):
    folder = save_adapter(tmp_path / "odd", TOY_DIR)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["peft_type"] = "FOO"
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"odd/adapter_config\.json: peft_type FOO is not one peft"):
        hs.load(str(folder))


def test_a_revision_of_a_local_model_is_refused_not_ignored(tmp_path):
    with pytest.raises(
        InputError, match=r"revision='v2' picks a revision of a hub model .* is a local folder"
    ):
        hs.load(str(TOY_DIR), revision="v2")
    good = save_adapter(tmp_path / "good", TOY_DIR)  # its base is a local folder: the same
    with pytest.raises(InputError, match="revision='v2'"):
        hs.load(str(good), revision="v2")


# --- sweeps: options ----------------------------------------------------------------------------------


@pytest.fixture
def in_process(monkeypatch):
    """The local executor, without worker processes: each task runs here, in order."""
    from headscope.sweeps import run as sweep_run
    from headscope.sweeps.executors import run_task

    monkeypatch.setattr(
        sweep_run, "run_local", lambda tasks, workers, retries: ((t, run_task(t)) for t in tasks)
    )


def manifest(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())["runs"]


def test_an_option_of_scan_changes_the_scan_in_a_sweep(tmp_path, in_process):
    swept = hs.sweep(str(TOY_DIR), tmp_path / "store", analyses="scan", detectors="induction", **FAST)
    assert not swept.failed
    assert set(swept.table.detector) == {"induction"}
    (entry,) = manifest(tmp_path / "store").values()
    # Every option the run read is recorded, given or default; none of the causal check's.
    assert entry["options"]["detectors"] == "induction" and entry["options"]["seq_len"] == 10
    assert entry["options"]["role_threshold"] == 0.3 and "verify" not in entry["options"]


@pytest.mark.parametrize(
    ("analyses", "options", "message"),
    [
        (["induction"], {"ablate": 2}, "ablate=2: a sweep stores the tables of induction and never runs"),
        (["induction"], {"draws": 4}, "so draws would change nothing"),
        (["scan"], {"verify": True}, "verify=True: a sweep .* never runs the causal check"),
        (["weights"], {"verify_k": 2}, "verify_k would change nothing"),
        (["weights", "icl"], {"k": 3}, "k=3: k means different things in weights and icl"),
        (
            ["weights"],
            {"weights.tokens": 300, "tokens": 400},
            "weights.tokens already sets tokens of weights",
        ),
        (["scan", "icl"], {"text": "a.txt"}, "text means different things in scan and icl"),
        (["weights"], {"icl.k": 3}, "icl is not one of this sweep's analyses"),
        (["weights"], {"weights.early": 3}, "weights has no option early"),
        (["weights"], {"seq_len": 20}, "seq_len is an option of none of weights"),
    ],
)
def test_options_a_sweep_would_not_use_are_refused(analyses, options, message):
    from headscope.sweeps.run import plan

    with pytest.raises(InputError, match=message):
        plan(analyses, options)


def test_options_go_to_the_analyses_that_read_them():
    from headscope.sweeps.run import plan

    planned = plan(["induction", "icl"], {"draws": 4, "seq_len": 20, "icl.k": 7, "tasks": "none"})
    assert planned["induction"].values == {"seq_len": 20}  # its draws are the ablation's: not for it
    assert planned["icl"].values == {"draws": 4, "k": 7, "tasks": "none"}
    assert planned["icl"].record["draws"] == 4 and "draws" not in planned["induction"].record


def test_a_repeated_set_name_is_refused():
    from headscope.sweeps.run import parse_settings

    with pytest.raises(InputError, match=r"--set seq_len=4: seq_len is already set \(--set seq_len=3\)"):
        parse_settings(["induction"], ["seq_len=3", "seq_len=4"])
    with pytest.raises(InputError, match=r"already set \(--seq-len 20\)"):
        parse_settings(["induction", "scan"], ["scan.seq_len=4"], {"seq_len": "--seq-len 20"})
    assert parse_settings(["weights"], ["tasks=a.yaml,b.yaml"]) == {"tasks": ["a.yaml", "b.yaml"]}


ICL_FAST = dict(tasks="none", context=60, early=10, late=40, window=3, resamples=0)


def test_a_path_option_is_stored_as_a_string_and_its_file_is_fingerprinted(tmp_path, in_process):
    texts = tmp_path / "held.txt"
    texts.write_text("\n\n".join(" ".join(f"t{i % 50}" for i in range(s, s + 70)) for s in range(6)) + "\n")
    store = tmp_path / "store"
    notes: list[str] = []
    swept = hs.sweep(str(TOY_DIR), store, analyses="icl", text=texts, on_note=notes.append, **ICL_FAST)
    assert not swept.failed and swept.computed
    (entry,) = manifest(store).values()
    assert entry["options"]["text"] == str(texts) and entry["inputs"]["text"].startswith("sha256:")
    assert not list(store.glob("**/*.tmp"))
    again = hs.sweep(str(TOY_DIR), store, analyses="icl", text=str(texts), **ICL_FAST)
    assert again.skipped and not again.computed
    # The same file name with other texts: the stored run is stale, computed again with a note.
    texts.write_text(texts.read_text().replace("t1 ", "t7 "))
    changed = hs.sweep(str(TOY_DIR), store, analyses="icl", text=texts, on_note=notes.append, **ICL_FAST)
    assert changed.computed and not changed.skipped
    assert any("a data file its options name changed" in note for note in notes), notes


# --- sweeps: the store --------------------------------------------------------------------------------


def test_an_adapter_run_is_computed_again_when_its_base_changes(tmp_path, in_process):
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    shutil.copytree(TOY_DIR, base)
    adapter = save_adapter(tmp_path / "lora", base)
    store = tmp_path / "store"
    first = hs.sweep(str(adapter), store, **FAST)
    assert first.computed and not first.failed
    assert hs.sweep(str(adapter), store, **FAST).skipped  # unchanged: reused
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(3.0)
    model.save_pretrained(base)
    notes: list[str] = []
    second = hs.sweep(str(adapter), store, on_note=notes.append, **FAST)
    assert second.computed and not second.skipped
    assert any("adapter's base" in note for note in notes), notes
    assert not np.allclose(first.table.score.to_numpy(float), second.table.score.to_numpy(float))
    # The adapter's own config (its scaling, say) is covered too.
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["lora_alpha"] = 2 * config["lora_alpha"]
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert hs.sweep(str(adapter), store, **FAST).computed


def test_a_changed_option_or_default_is_a_rerun_with_a_note(tmp_path, in_process):
    store = tmp_path / "store"
    assert hs.sweep(str(TOY_DIR), store, **FAST).computed
    notes: list[str] = []
    again = hs.sweep(str(TOY_DIR), store, on_note=notes.append, **{**FAST, "seq_len": 12})
    assert again.computed and any("its options changed" in note for note in notes), notes
    # A store written when only the given options were recorded: the defaults the run read are not
    # known, so it is computed again (never reused on a guess).
    runs = json.loads((store / "manifest.json").read_text())
    (entry,) = runs["runs"].values()
    entry["options"] = {"resamples": 0, "seq_len": 12, "n_seqs": 2}
    (store / "manifest.json").write_text(json.dumps(runs))
    assert hs.sweep(str(TOY_DIR), store, **{**FAST, "seq_len": 12}).computed


def test_two_checkpoints_at_one_step_are_refused(tmp_path):
    """Their scores would be mixed into one point of the series (the emergence table's max per step)."""
    from headscope.sweeps.specs import expand

    for name in ("checkpoint-100", "step-0100", "step-200"):
        (tmp_path / "run" / name).mkdir(parents=True)
        (tmp_path / "run" / name / "config.json").write_text("{}")
    with pytest.raises(InputError, match="checkpoints 'checkpoint-100' and 'step-0100' both have step 100"):
        expand([str(tmp_path / "run")])


def test_a_result_json_cannot_hold_leaves_nothing_half_written(tmp_path, monkeypatch):
    from headscope.sweeps import run as sweep_run
    from headscope.sweeps.store import Store

    store = Store(tmp_path / "store")
    store.open()
    with pytest.raises(TypeError):
        store.record("toy__induction", {"options": {}, "fingerprint": "f"}, {"rows": [], "odd": object()})
    assert not list((tmp_path / "store").rglob("*.json")) and not store.runs
    # In a sweep: the run is recorded as failed, with the reason, and the sweep goes on.
    monkeypatch.setattr(
        sweep_run,
        "run_local",
        lambda tasks, workers, retries: ((t, {"ok": True, "payload": {"rows": [Path("x")]}}) for t in tasks),
    )
    swept = hs.sweep(str(TOY_DIR), tmp_path / "other", **FAST)
    (why,) = swept.failed.values()
    assert "its result cannot be stored as JSON (TypeError" in why
    assert not list((tmp_path / "other" / "runs").glob("*.json"))


def test_a_cached_hub_model_is_fingerprinted_by_its_commit(monkeypatch):
    """A branch that moved in the cache is another model: its runs are computed again."""
    import huggingface_hub

    from headscope.sweeps.specs import Target, fingerprint

    commit = {"value": "a" * 40}
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, revision=None, local_files_only=False: f"/cache/snapshots/{commit['value']}",
    )
    target = Target("org/model", "org/model", "org/model")
    assert fingerprint(target) == f"hub:org/model@{'a' * 40}"
    commit["value"] = "b" * 40
    assert fingerprint(target) == f"hub:org/model@{'b' * 40}"
    assert fingerprint(Target("org/model", "org/model@main", "org/model", 0, "main")).endswith("b" * 40)


@pytest.mark.parametrize(
    ("cpus", "workers", "budget", "threads"),
    [(8, 2, None, 4), (8, 3, None, 2), (2, 4, None, 1), (8, 2, "1", 1), (8, 2, "16", 4), (8, 1, "junk", 8)],
)
def test_local_workers_split_the_cpus_within_an_explicit_thread_budget(
    monkeypatch, cpus, workers, budget, threads
):
    from headscope.sweeps import executors

    monkeypatch.setattr(executors.os, "cpu_count", lambda: cpus)
    if budget is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", budget)
    assert executors.worker_threads(workers) == threads
