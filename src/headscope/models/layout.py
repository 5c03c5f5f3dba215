"""What a loaded model is: its attention layout (layers, query and KV heads) and the loaded bundle."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from headscope.errors import ModelLoadError

from .options import DeviceName, DtypeName  # noqa: F401  (declared with the load options)


@dataclass(frozen=True)
class HeadLayout:
    """How a model's attention is laid out. Layers and heads are 0-based.

    ``head_dim`` is the query/key width of one head; ``value_dim`` is set only where values are
    narrower or wider (DeepSeek's multi-head latent attention, MiMo), so readers of value vectors
    (the OV circuit, value norms) use :attr:`v_head_dim`.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    max_positions: int | None
    # Layers that attend within a sliding window (Gemma 2/3, Mistral-style configs), and its size.
    local_layers: tuple[int, ...] = ()
    window: int | None = None
    value_dim: int | None = None
    # Layers that attend only within their own block of ``chunk`` tokens (Llama 4).
    chunked_layers: tuple[int, ...] = ()
    chunk: int | None = None
    # Layers with no softmax attention (hybrids: mamba, linear attention, conv), with their kind.
    non_attention_layers: tuple[tuple[int, str], ...] = ()

    @property
    def v_head_dim(self) -> int:
        """The width of one head's value vector (``head_dim`` unless the config says otherwise)."""
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with softmax attention heads: every layer but a hybrid's mamba/linear ones."""
        skipped = {layer for layer, _ in self.non_attention_layers}
        return tuple(i for i in range(self.n_layers) if i not in skipped)

    @property
    def global_layers(self) -> tuple[int, ...]:
        """Attention layers that see every earlier key (neither windowed nor chunked)."""
        narrowed = set(self.local_layers) | set(self.chunked_layers)
        return tuple(i for i in self.attention_layers if i not in narrowed)

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_group(self, head: int) -> int:
        """The KV head that query head ``head`` reads (transformers' repeat_kv order)."""
        return head // self.group_size

    def describe(self) -> str:
        """One line on the heads, e.g. "4 layers x 8 query heads (2 KV heads, 4 per group), head dim 16"."""
        dims = f"head dim {self.head_dim}"
        if self.v_head_dim != self.head_dim:
            dims = f"query/key head dim {self.head_dim}, value head dim {self.v_head_dim}"
        text = (
            f"{self.n_layers} layers x {self.n_heads} query heads ({self.n_kv_heads} KV heads, "
            f"{self.group_size} per group), {dims}, d_model {self.d_model}"
        )
        if self.non_attention_layers:
            text += f", attention in {len(self.attention_layers)} of {self.n_layers} layers"
        return text

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any = None) -> HeadLayout:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        n_heads = int(text.num_attention_heads)
        d_model = int(text.hidden_size)
        head_dim, value_dim = _head_dims(text, n_heads, d_model)
        n_kv = _kv_heads(text, n_heads)
        max_pos = next(
            (
                getattr(text, name)
                for name in ("max_position_embeddings", "n_positions", "max_seq_len")
                if getattr(text, name, None)
            ),
            None,
        )
        if max_pos is None and tokenizer is not None and tokenizer.model_max_length < 10**7:
            max_pos = tokenizer.model_max_length
        if n_heads % n_kv:
            raise ModelLoadError(f"{n_heads} query heads do not divide into {n_kv} KV heads")
        n_layers = int(text.num_hidden_layers)
        kinds = layer_attention(config, n_layers)
        return cls(
            n_layers,
            n_heads,
            n_kv,
            head_dim,
            d_model,
            max_pos,
            tuple(kinds["local_layers"]),
            kinds["window"],
            value_dim if value_dim != head_dim else None,
            tuple(kinds["chunked_layers"]),
            kinds["chunk"],
            tuple(kinds["non_attention_layers"]),
        )


def _kv_heads(text: Any, n_heads: int) -> int:
    """KV heads per attention layer, as the modeling code builds them (not always the config's name).

    Falcon keeps ``num_kv_heads`` only with ``new_decoder_architecture``; otherwise ``multi_query``
    means one KV head and plain Falcon has one per query head (FalconAttention). Multi-head latent
    attention (DeepSeek V2/V3 and kin) decompresses a key and a value per query head from its
    shared latent, whatever ``num_key_value_heads`` says. Everything else names them
    ``num_key_value_heads`` (GPT-BigCode sets it from ``multi_query``) or has one per query head.
    """
    if getattr(text, "model_type", None) == "falcon":
        if text.new_decoder_architecture:
            return int(text.num_kv_heads)
        return 1 if text.multi_query else n_heads
    if _is_mla(text):
        return n_heads
    return int(getattr(text, "num_key_value_heads", None) or n_heads)


def _is_mla(text: Any) -> bool:
    """Multi-head latent attention: keys split into a no-position part and a rotary part."""
    return getattr(text, "qk_nope_head_dim", None) is not None and bool(
        getattr(text, "qk_rope_head_dim", None)
    )


def _head_dims(text: Any, n_heads: int, d_model: int) -> tuple[int, int]:
    """(query/key width, value width) of one head.

    MLA configs set ``head_dim`` to the rotary part alone (DeepSeek V3: 64 of 192); queries and
    keys are ``qk_nope_head_dim + qk_rope_head_dim`` wide and values ``v_head_dim``. MiMo-V2 has a
    plain ``head_dim`` with a narrower ``v_head_dim``. Without ``head_dim`` (GPT-2, BERT, Falcon's
    own property) a head is ``hidden_size / num_attention_heads`` wide.
    """
    if _is_mla(text):
        head_dim = int(text.qk_nope_head_dim) + int(text.qk_rope_head_dim)
    else:
        head_dim = int(getattr(text, "head_dim", None) or d_model // n_heads)
    return head_dim, int(getattr(text, "v_head_dim", None) or head_dim)


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
    # eval mode only while an analysis runs (capture.borrow.borrowed), and restores them after.
    owned: bool = True
    # What the caller asked for: under "auto" a streaming capture that fails its check on the model
    # (headscope.capture.checks) falls back to eager.
    capture_requested: str = "auto"
    active: int = field(default=0, repr=False, compare=False)  # nesting depth of capture.borrow.borrowed

    @property
    def base(self) -> Any:
        from .anatomy import base_model

        return base_model(self.model)

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


# Layer kinds (``layer_types`` entries) that attend within a sliding window, or a chunk of their own.
_LOCAL_KINDS = frozenset({"sliding_attention", "hybrid_sliding"})
_CHUNKED_KINDS = frozenset({"chunked_attention"})
# Layer kinds without softmax attention: recurrent (mamba, gated delta net, lightning), short
# convolutions (LFM2) and Nemotron-H's MLP/MoE-only blocks. "hybrid" (Zamba, Falcon-H1) layers do
# run attention beside their mamba mixer, so they count as attention.
_NON_ATTENTION_KINDS = frozenset({"linear_attention", "mamba", "mamba2", "conv", "mlp", "moe"})
# Families whose modeling code (transformers 5.24) masks every attention layer with the config's
# ``sliding_window`` when it is set, whatever ``layer_types`` says (Mistral warns that it ignores it).
_UNIFORM_WINDOW = frozenset(
    {
        "blt",
        "doge",
        "minimax",
        "ministral3",
        "mistral",
        "mixtral",
        "phi3",
        "phi4_multimodal",
        "phimoe",
        "qwen3_moe",
        "starcoder2",
        "voxtral_realtime",
    }
)


def _window(text: Any) -> int | None:
    """The sliding window the model applies, or None (``use_sliding_window=False``, 0 or unset)."""
    if getattr(text, "model_type", None) == "gpt_neo":
        return int(text.window_size)
    window = getattr(text, "sliding_window", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return None
    return int(window)


def _layer_kinds(text: Any, n_layers: int, window: int | None) -> list[str]:
    """Each layer's kind as transformers' modeling code decides it, in ``layer_types`` names.

    GPT-Neo names its layers in ``attention_layers`` ("global"/"local" over ``window_size``). Other
    configs carry ``layer_types`` (normalised in transformers 5: Qwen2/3 from
    ``use_sliding_window``/``max_window_layers``, Llama 4 from ``no_rope_layers``, Jamba from
    ``attn_layer_period``/``attn_layer_offset``, ModernBERT from ``global_attn_every_n_layers``). A
    family in ``_UNIFORM_WINDOW``, or a config without ``layer_types``, windows every attention layer
    exactly when ``sliding_window`` is set.
    """
    if getattr(text, "model_type", None) == "gpt_neo":
        return [
            "sliding_attention" if kind == "local" else "full_attention" for kind in text.attention_layers
        ]
    given = list(getattr(text, "layer_types", None) or [])
    kinds = given or ["full_attention"] * n_layers
    if not given or getattr(text, "model_type", None) in _UNIFORM_WINDOW:
        uniform = "sliding_attention" if window is not None else "full_attention"
        kinds = [kind if kind in _NON_ATTENTION_KINDS | _CHUNKED_KINDS else uniform for kind in kinds]
    # Jamba's legacy names say which recurrence a "linear_attention" layer runs ("mamba").
    legacy = list(getattr(text, "layers_block_type", None) or [])
    if len(legacy) == len(kinds):
        kinds = [old if new in _NON_ATTENTION_KINDS else new for new, old in zip(kinds, legacy, strict=True)]
    return kinds


def layer_attention(config: Any, n_layers: int) -> dict[str, Any]:
    """Which layers attend locally (a sliding window), in chunks, globally, or not at all.

    Read from the config the way transformers' modeling code reads it (see ``_layer_kinds``), for
    ``headscope info`` and the layout. The capture never relies on this: it reads each layer's
    visible keys from its mask.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = _window(text)
    kinds = _layer_kinds(text, n_layers, window)[:n_layers]
    non_attention = [(i, kind) for i, kind in enumerate(kinds) if kind in _NON_ATTENTION_KINDS]
    local = [i for i, kind in enumerate(kinds) if kind in _LOCAL_KINDS and window is not None]
    chunk = getattr(text, "attention_chunk_size", None)
    chunked = [i for i, kind in enumerate(kinds) if kind in _CHUNKED_KINDS and chunk]
    skipped = set(local) | set(chunked) | {i for i, _ in non_attention}
    global_ = [i for i in range(n_layers) if i not in skipped]
    parts = []
    if local:
        parts.append(f"local (window {window}): {_ranges(local)}")
    if chunked:
        parts.append(f"chunked (chunk {chunk}): {_ranges(chunked)}")
    if parts or non_attention:
        parts.append(f"global: {_ranges(global_) or 'none'}")
    for kind in dict.fromkeys(kind for _, kind in non_attention):
        parts.append(f"not attention ({kind}): {_ranges([i for i, k in non_attention if k == kind])}")
    return {
        "window": window if local else None,
        "local_layers": local,
        "chunk": chunk if chunked else None,
        "chunked_layers": chunked,
        "global_layers": global_,
        "non_attention_layers": non_attention,
        "summary": "; ".join(parts) or "global in every layer",
    }
