"""Slow: the dequantized GGUF cache holds float32 whatever dtype wrote it, is reused and invalidated;
a .gguf path loads like its alias; the chunked Gemma 3 alias."""

from __future__ import annotations

import shutil

import gguf as gguf_library
import pytest
import torch

from headscope.models import bundled_path, cache_root, gguf_cache_dir, gguf_cache_is_valid, load

pytestmark = pytest.mark.slow


def weights(loaded) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {name: tensor.detach().clone() for name, tensor in loaded.model.state_dict().items()}


def test_a_bfloat16_run_leaves_float32_weights_in_the_cache(tmp_path, monkeypatch):
    """A cold bf16 run, then a float32 run from its cache, equals a cold float32 run, bit for bit.

    The cold float32 run reads a copy of the bundled GGUF, so it also shows that a .gguf path loads
    like the alias, that a second load of it comes from the cache, and that changing one byte of the
    file gives it a new cache key. (Each cold run dequantizes 135M weights: one test pays for two.)
    """
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "first"))
    parses = []

    class Counted(gguf_library.GGUFReader):
        def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf_library, "GGUFReader", Counted)
    cold_bf16 = load("smollm2-135m", dtype="bfloat16")
    assert len(parses) == 1  # tokenizer, config and weights read one parse (models.gguf._one_parse)
    assert gguf_library.GGUFReader is Counted
    assert "dequantized cache" not in cold_bf16.source
    assert {p.dtype for p in cold_bf16.model.parameters()} == {torch.bfloat16}
    bf16 = weights(cold_bf16)
    del cold_bf16
    warm = load("smollm2-135m", dtype="float32")
    assert "dequantized cache" in warm.source
    warm_weights = weights(warm)
    del warm
    (entry,) = (tmp_path / "first" / "gguf").iterdir()
    assert gguf_cache_is_valid(entry)
    warm_bf16 = weights(load("smollm2-135m", dtype="bfloat16"))

    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "second"))
    bundled = bundled_path("smollm2-135m")
    gguf = tmp_path / "copy" / bundled.name
    gguf.parent.mkdir()
    shutil.copyfile(bundled, gguf)
    cold_loaded = load(str(gguf), dtype="float32")
    assert "dequantized cache" not in cold_loaded.source
    assert cold_loaded.name == gguf.name
    layout = cold_loaded.layout
    assert (layout.n_layers, layout.n_heads, layout.n_kv_heads, layout.max_positions) == (30, 9, 3, 8192)
    cold = weights(cold_loaded)
    del cold_loaded
    assert cold.keys() == warm_weights.keys() == bf16.keys() == warm_bf16.keys()
    for name, tensor in cold.items():
        assert tensor.dtype == warm_weights[name].dtype == torch.float32
        assert torch.equal(tensor, warm_weights[name]), name
        # A bf16 run sees the float32 weights rounded, cold or warm alike.
        assert torch.equal(bf16[name], tensor.to(torch.bfloat16)), name
        assert torch.equal(warm_bf16[name], bf16[name]), name
    del bf16, warm_bf16, warm_weights

    entries = list((tmp_path / "second" / "gguf").iterdir())
    assert entries == [gguf_cache_dir(gguf)]  # the entry is keyed by the file's content
    again = load(str(gguf))
    assert "dequantized cache" in again.source and str(entries[0]) in again.source
    del again
    # Change one byte of the last tensor's data: same format, different content, so another key,
    # under which nothing is cached yet (a load would dequantize afresh: not paid a third time here).
    with gguf.open("r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0x01]))
    changed = gguf_cache_dir(gguf)
    assert changed != entries[0] and changed.parent == entries[0].parent and not changed.exists()


def test_gemma3_270m_loads_from_its_four_chunk_wheels(gemma3):
    gemma = gemma3
    config = gemma.model.config
    print("sliding_window", config.sliding_window, "layer_types", config.layer_types)
    layout = gemma.layout
    assert (layout.n_layers, layout.n_heads, layout.n_kv_heads) == (18, 4, 1)
    assert (layout.head_dim, layout.d_model, layout.group_size) == (256, 640, 4)
    assert config.vocab_size == 262144 and len(gemma.tokenizer) == 262144
    assert gemma.is_causal
    # Local sliding-window attention except every sixth layer (layers 5, 11 and 17 are global).
    assert config.sliding_window == 512
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    assert full == [5, 11, 17] and len(config.layer_types) == 18
    entries = list((cache_root() / "gguf").iterdir())
    assert entries and all(gguf_cache_is_valid(entry) for entry in entries)
    assert gemma.layout.local_layers == tuple(i for i in range(18) if i not in (5, 11, 17))
    assert gemma.layout.window == 512
    # The weights make sense of English: far below the uniform ln(262144) = 12.5 nats per token.
    batch = gemma.tokenizer("The cat sat on the mat because it was tired and warm.", return_tensors="pt")
    with torch.no_grad():
        loss = gemma.model(**batch, labels=batch["input_ids"]).loss
    assert loss < 5, loss
