"""What a loaded model is: its attention layout (layers, query and KV heads) and the loaded bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # Layers that attend within a sliding window (Gemma 2/3, Mistral-style configs), and its size.
    local_layers: tuple[int, ...] = ()
    window: int | None = None

    @property
    def global_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if i not in self.local_layers)

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
        n_layers = int(text_config.num_hidden_layers)
        kinds = layer_attention(config, n_layers)
        return cls(
            n_layers, n_heads, n_kv, head_dim, d_model, max_pos, tuple(kinds["local_layers"]), kinds["window"]
        )


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
    # False for a model the caller loaded: headscope switches its attention implementation and
    # eval mode only while an analysis runs (capture.prepared), and restores them after.
    owned: bool = True
    active: int = field(default=0, repr=False, compare=False)  # nesting depth of capture.prepared

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


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 4] -> "0–2, 4"."""
    parts, start = [], None
    for index, layer in enumerate(layers):
        if start is None:
            start = layer
        if index + 1 == len(layers) or layers[index + 1] != layer + 1:
            parts.append(str(start) if start == layer else f"{start}–{layer}")
            start = None
    return ", ".join(parts)


def layer_attention(config: Any, n_layers: int) -> dict[str, Any]:
    """Which layers attend locally (a sliding window) and which globally, from the config.

    ``layer_types`` (Gemma 2/3, Qwen 2, Mistral-style configs in transformers 5) names each
    layer's kind; without it, a ``sliding_window`` that the model uses applies to every layer.
    The capture never relies on this: it reads each layer's visible keys from its mask.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    types = list(getattr(text, "layer_types", None) or [])
    if not types:
        uses_window = window is not None and getattr(text, "use_sliding_window", True)
        types = ["sliding_attention" if uses_window else "full_attention"] * n_layers
    local = [i for i, t in enumerate(types) if "sliding" in t or "local" in t]
    global_ = [i for i in range(n_layers) if i not in local]
    return {
        "window": window if local else None,
        "local_layers": local,
        "global_layers": global_,
        "summary": (
            f"local (window {window}): {_ranges(local)}; global: {_ranges(global_) or 'none'}"
            if local
            else "global in every layer"
        ),
    }
