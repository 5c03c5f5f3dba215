"""A model the caller already loaded (and its tokenizer), wrapped for head analyses without changing it."""

from __future__ import annotations

from typing import Any, Literal

from headscope.errors import InputError, ModelLoadError

from .layout import HeadLayout, LoadedModel
from .load import can_stream, check_tokenizer_fits, check_weights_present, decide_capture, is_causal_config

CaptureName = Literal["auto", "stream", "eager"]


def wrap(
    model: Any, tokenizer: Any, *, capture: CaptureName = "auto", name: str | None = None
) -> LoadedModel:
    """Wrap a loaded ``PreTrainedModel`` and its tokenizer. Nothing about the model changes here.

    While an analysis runs, :func:`headscope.capture.prepared` switches the model to headscope's
    attention implementation and to eval mode, and restores both when it ends (also on an error).
    Weights, device and dtype are the caller's and stay as they are.
    """
    import torch

    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise InputError(
            f"expected a model spec (alias, path, .gguf file, hub id) or a transformers PreTrainedModel, "
            f"got {type(model).__name__}"
        )
    if tokenizer is None:
        raise InputError(
            f"a model object needs its tokenizer: hs.load(model, tokenizer) ({type(model).__name__} was given "
            "without one)",
            hint="pass the tokenizer the model was trained with, e.g. AutoTokenizer.from_pretrained(...)",
        )
    if not callable(tokenizer) or not hasattr(tokenizer, "all_special_ids"):
        raise InputError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    model, adapter = unwrap_adapters(model)
    check_weights_present(model)
    check_tokenizer_fits(model, tokenizer)
    config = model.config
    causal = is_causal_config(config)
    mode = decide_capture(model, capture)
    current = getattr(config, "_attn_implementation", None)
    if mode == "eager" and current not in (None, "eager") and not can_stream(model):
        raise ModelLoadError(
            f"{type(model).__name__} uses attn_implementation={current!r} and cannot switch it while loaded, "
            "so its attention weights cannot be read",
            hint="load it with attn_implementation='eager'",
        )
    layout = HeadLayout.from_config(config, tokenizer)
    label = name or getattr(config, "name_or_path", None) or type(model).__name__
    label = str(label).rstrip("/").split("/")[-1] or type(model).__name__
    if adapter and not name:
        label = f"{label}+{adapter}"
    return LoadedModel(
        label, model, tokenizer, layout, causal, mode, "object", owned=False, capture_requested=capture
    )


def unwrap_adapters(model: Any) -> tuple[Any, str]:
    """A peft ``PeftModel`` -> (the transformers model inside it, with its adapter layers in place,
    the active adapter's name); any other model -> (itself, ""). The adapted model is what is
    analysed: its forward passes run through the adapters as they are set now (enabled or not),
    and the projections headscope reads (W_Q, W_V, W_O …) are the adapted ones."""
    if hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None)):
        active = getattr(model, "active_adapter", "") or ""
        if isinstance(active, list | tuple):
            active = "+".join(active)
        return model.get_base_model(), str(active)
    return model, ""
