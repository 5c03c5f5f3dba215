"""A model the caller already loaded (and its tokenizer), wrapped for head analyses without changing it."""

from __future__ import annotations

from typing import Any

from headscope.errors import InputError

from .layout import LoadedModel
from .load import assemble, check_weights_present, unwrap_adapters
from .options import CaptureName


def wrap(
    model: Any, tokenizer: Any, *, capture: CaptureName = "auto", name: str | None = None
) -> LoadedModel:
    """Wrap a loaded ``PreTrainedModel`` and its tokenizer. Nothing about the model changes here.

    While an analysis runs, :func:`headscope.capture.borrow.borrowed` switches the model to headscope's
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
    config = model.config
    label = name or getattr(config, "name_or_path", None) or type(model).__name__
    label = str(label).rstrip("/").split("/")[-1] or type(model).__name__
    if adapter and not name:
        label = f"{label}+{adapter}"
    return assemble(model, tokenizer, name=label, source="object", capture=capture, owned=False)


__all__ = ["CaptureName", "unwrap_adapters", "wrap"]
