"""What a loaded model is: its attention layout (layers, query and KV heads) and the loaded bundle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from headscope.errors import ModelLoadError

DeviceName = Literal["auto", "cpu", "cuda", "mps"]


DtypeName = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class HeadLayout:
    """How a model's attention is laid out. Layers and heads are 0-based."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    max_positions: int | None

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_group(self, head: int) -> int:
        """The KV head that query head ``head`` reads (transformers' repeat_kv order)."""
        return head // self.group_size

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any = None) -> HeadLayout:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        n_heads = int(text_config.num_attention_heads)
        n_kv = int(getattr(text_config, "num_key_value_heads", None) or n_heads)
        d_model = int(text_config.hidden_size)
        head_dim = int(getattr(text_config, "head_dim", None) or d_model // n_heads)
        max_pos = getattr(text_config, "max_position_embeddings", None) or getattr(
            text_config, "n_positions", None
        )
        if max_pos is None and tokenizer is not None and tokenizer.model_max_length < 10**7:
            max_pos = tokenizer.model_max_length
        if n_heads % n_kv:
            raise ModelLoadError(f"{n_heads} query heads do not divide into {n_kv} KV heads")
        return cls(int(text_config.num_hidden_layers), n_heads, n_kv, head_dim, d_model, max_pos)


@dataclass
class LoadedModel:
    """A model ready for capture. ``model`` is the full model; ``base`` skips the LM head."""

    name: str
    model: Any
    tokenizer: Any
    layout: HeadLayout
    is_causal: bool
    capture_mode: Literal["stream", "eager"]
    source: str

    @property
    def base(self) -> Any:
        return getattr(self.model, "base_model", self.model)

    @property
    def has_lm_head(self) -> bool:
        return self.base is not self.model

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def max_positions(self) -> int | None:
        return self.layout.max_positions
