"""Load a resolved model for head analysis, with the streaming attention function where it can."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Literal

from headscope.errors import InputError, ModelLoadError, ModelNotFoundError, elide

from .bundled import BUNDLED, DEFAULT_MODEL, log
from .gguf import _load_gguf
from .layout import DeviceName, DtypeName, HeadLayout, LoadedModel
from .spec import ResolvedSpec, resolve


def _resolve_dtype(name: DtypeName) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _resolve_device(name: DeviceName) -> str:
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "--device cuda was asked for, but torch sees no CUDA device", hint="use --device cpu"
        )
    if name == "mps" and not torch.backends.mps.is_available():
        raise InputError("--device mps was asked for, but MPS is not available", hint="use --device cpu")
    return name


def is_causal_config(config: Any) -> bool:
    """Decoder-only language models attend causally; encoders (BERT and kin) do not."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(
            f"{config.model_type} is an encoder-decoder model; headscope reads self-attention models "
            "(decoder-only LMs and encoders)"
        )
    if getattr(config, "is_decoder", False):
        return True
    return (
        config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def _load_hf(
    resolved: ResolvedSpec, dtype: Any, placement: dict[str, Any], revision: str | None = None
) -> tuple[Any, Any, str]:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    local_only = resolved.kind == "dir" or os.environ.get("HF_HUB_OFFLINE") == "1"
    if revision is not None:
        placement = {**placement, "revision": revision}
    try:
        config = AutoConfig.from_pretrained(
            resolved.location, local_files_only=local_only, **({"revision": revision} if revision else {})
        )
    except OSError as exc:
        if resolved.kind == "hub":
            raise ModelNotFoundError(
                f"model '{resolved.location}' is not a local folder and is not in the Hugging Face cache",
                hint=f"download it first, or pass a local path or one of the aliases: {', '.join(BUNDLED)}",
            ) from exc
        raise ModelLoadError(f"cannot read config of {resolved.location}: {exc}") from exc
    except ValueError as exc:
        raise ModelLoadError(f"{resolved.location}: {exc}") from exc
    causal = is_causal_config(config)
    loader = AutoModelForCausalLM if causal else AutoModel
    try:
        tok = AutoTokenizer.from_pretrained(
            resolved.location, local_files_only=local_only, **({"revision": revision} if revision else {})
        )
        model = loader.from_pretrained(
            resolved.location,
            attn_implementation="eager",
            dtype=dtype,
            local_files_only=local_only,
            **placement,
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot load {resolved.location}: {type(exc).__name__}: {exc}") from exc
    return model, tok, resolved.location


def load(
    spec: str = DEFAULT_MODEL,
    device: DeviceName = "cpu",
    dtype: DtypeName = "float32",
    capture: Literal["auto", "stream", "eager"] = "auto",
    use_cache: bool = True,
    device_map: str | None = None,
    revision: str | None = None,
) -> LoadedModel:
    """Load a model for head analyses. Nothing is fetched from a hub unless the caller allows it.

    ``revision`` picks a revision (branch, tag or commit) of a hub model already in the cache.

    ``device_map="auto"`` hands placement to accelerate, which spreads a model that is larger than
    one device over several GPUs and CPU memory; ``device`` is then ignored.
    """
    resolved = resolve(spec)
    if revision is not None and resolved.kind not in ("hub", "adapter"):
        what = {"gguf": "a .gguf file", "dir": "a local folder"}[resolved.kind]
        raise InputError(
            f"revision={revision!r} picks a revision of a hub model in the cache; {spec} is "
            f"{'a bundled alias' if resolved.alias else what}, which has none",
            hint="drop the revision, or give the hub id",
        )
    if resolved.kind == "adapter":
        return _load_adapter(resolved, device, dtype, capture, use_cache, device_map, revision)
    torch_dtype = _resolve_dtype(dtype)
    if device_map not in (None, "auto"):
        raise InputError(f"--device-map must be 'auto', got {device_map!r}")
    placement: dict[str, Any] = {"device_map": device_map} if device_map else {}
    device_name = _resolve_device(device) if not device_map else None
    if resolved.kind == "gguf":
        model, tokenizer, source = _load_gguf(resolved, torch_dtype, use_cache, placement)
    else:
        model, tokenizer, source = _load_hf(resolved, torch_dtype, placement, revision)
    model.eval()
    if device_name is not None:
        model.to(device_name)
    name = resolved.alias or (resolved.gguf_file or Path(resolved.location).name)
    return assemble(model, tokenizer, name=name, source=source, capture=capture)


def assemble(
    model: Any, tokenizer: Any, *, name: str, source: str, capture: str, owned: bool = True
) -> LoadedModel:
    """The one place a :class:`LoadedModel` is made from a model and its tokenizer, with the checks
    every way in needs: :func:`load` (a spec, ``owned``) and :func:`headscope.models.wrap.wrap` (the
    caller's model) come here; an adapter is its base's, with the adapted model in it.

    The tokenizer must fit the embedding, the model must be a self-attention model (causal or not),
    the capture mode is decided, a caller's model must be able to give its attention weights, and
    the head layout is read from the config. Nothing about the model changes here.
    """
    check_tokenizer_fits(model, tokenizer)
    config = model.config
    causal = is_causal_config(config)
    mode = decide_capture(model, capture)
    current = getattr(config, "_attn_implementation", None)
    if not owned and mode == "eager" and current not in (None, "eager") and not can_stream(model):
        raise ModelLoadError(
            f"{type(model).__name__} uses attn_implementation={current!r} and cannot switch it while loaded, "
            "so its attention weights cannot be read",
            hint="load it with attn_implementation='eager'",
        )
    layout = HeadLayout.from_config(config, tokenizer)
    return LoadedModel(
        name, model, tokenizer, layout, causal, mode, source, owned=owned, capture_requested=capture
    )


def _load_adapter(
    resolved: ResolvedSpec,
    device: DeviceName,
    dtype: DtypeName,
    capture: Literal["auto", "stream", "eager"],
    use_cache: bool,
    device_map: str | None,
    revision: str | None,
) -> LoadedModel:
    """An adapter folder: its base model (alias, folder, .gguf or cached hub id, as the adapter's
    config names it), loaded as any spec, with the adapter put on it by peft, active, in eval mode.
    The model headscope analyses is the adapted one (:func:`unwrap_adapters`)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ModelLoadError(
            f"{resolved.location} is a peft adapter, and peft is not installed",
            hint='pip install "headscope[peft]"',
        ) from None
    for folder in (*resolved.inner, resolved.location):
        _check_adapter_kind(folder)  # before the base model loads
    try:
        base = load(resolved.base or "", device, dtype, capture, use_cache, device_map, revision)
    except ModelNotFoundError as exc:
        named_by = resolved.inner[0] if resolved.inner else resolved.location
        raise ModelNotFoundError(
            f"{named_by}: its base model {resolved.base!r} (base_model_name_or_path in "
            f"adapter_config.json) is not here: {exc.message}",
            hint="set base_model_name_or_path to a local folder, a .gguf file, an alias or a cached hub id",
        ) from exc
    # An adapter whose base is another adapter folder was trained on that adapter's model: the inner
    # adapters are merged into the base, innermost first, and the outer one is put on the result.
    model, name = base.model, base.name
    for inner in resolved.inner:
        model = _put_adapter(PeftModel, model, inner, name).merge_and_unload()
        name = f"{name}+{Path(inner).name}"
    adapted = _put_adapter(PeftModel, model, resolved.location, name).eval()
    model, _ = unwrap_adapters(adapted)
    # The adapter layers sit inside the base's modules: the base's tokenizer, layout, attention and
    # capture mode (checked by assemble when the base loaded) are the adapted model's too.
    return dataclasses.replace(
        base, name=f"{name}+{Path(resolved.location).name}", model=model, capture_requested=capture
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


def _check_adapter_kind(folder: str) -> None:
    """An adapter peft knows, and one whose model headscope can run: prompt-learning adapters
    (prompt tuning, prefix tuning, p-tuning) add virtual tokens in peft's own forward, which the
    analyses' forward passes would not carry (their numbers would be the base model's)."""
    import json

    import peft

    config = Path(folder) / "adapter_config.json"
    kind = json.loads(config.read_text(encoding="utf-8")).get("peft_type")
    known = {str(member.value) for member in peft.PeftType}
    if not isinstance(kind, str) or kind not in known:
        raise InputError(
            f"{config}: peft_type {elide(kind, 40)} is not one peft {peft.__version__} knows",
            hint="save the adapter again with save_pretrained, or upgrade peft",
        )
    try:
        loaded = peft.PeftConfig.from_pretrained(folder)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise InputError(
            f"{config}: peft cannot read it ({type(exc).__name__}: {elide(first, 200)})",
            hint="save the adapter again with save_pretrained",
        ) from None
    if getattr(loaded, "is_prompt_learning", False) or kind == "ADAPTION_PROMPT":
        raise InputError(
            f"{folder}: a {kind} adapter prepends learned prompts inside peft's own forward pass, which "
            "the analyses' forward passes do not carry: its numbers would be the base model's",
            hint="headscope reads adapters that change the weights: LoRA, DoRA, IA3 and the like",
        )


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+?): copying a param with shape torch\.Size\(\[([^\]]*)\]\) from checkpoint, "
    r"the shape in current model is torch\.Size\(\[([^\]]*)\]\)"
)


def _put_adapter(peft_model: Any, model: Any, folder: str, base_name: str) -> Any:
    """``PeftModel.from_pretrained(model, folder)``; an adapter that does not fit the model is said in
    one line (the first tensor whose shape differs), not as peft's list of every mismatch."""
    try:
        return peft_model.from_pretrained(model, folder)
    except Exception as exc:
        text = str(exc)
        found = _SIZE_MISMATCH.search(text)
        if found is not None:
            tensor, theirs, ours = found.groups()
            tensor = tensor.removeprefix("base_model.model.")
            count = len(_SIZE_MISMATCH.findall(text))
            more = f"; {count - 1} more tensors differ" if count > 1 else ""
            raise ModelLoadError(
                f"the adapter {folder} does not fit its base {base_name}: {tensor} is [{theirs}] in the "
                f"adapter and [{ours}] in the base{more}",
                hint="base_model_name_or_path in adapter_config.json must name the model the adapter "
                "was trained on",
            ) from None
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise ModelLoadError(
            f"cannot put the adapter {folder} on {base_name}: {type(exc).__name__}: {elide(first, 300)}"
        ) from exc


def can_stream(model: Any) -> bool:
    """Whether the model routes attention through transformers' AttentionInterface."""
    return bool(getattr(model, "_can_set_attn_implementation", lambda: False)())


def decide_capture(model: Any, capture: str) -> Literal["stream", "eager"]:
    """The capture mode for ``model``: streaming where the architecture allows it, else eager.

    Nothing is switched here: :func:`headscope.capture.borrow.borrowed` installs the streaming attention
    function when an analysis runs (and, for a caller's model, restores its own afterwards).
    """
    if capture not in ("auto", "stream", "eager"):
        raise InputError(f"--capture must be auto, stream or eager, got {capture!r}")
    if capture == "eager":
        return "eager"
    if can_stream(model):
        return "stream"
    if capture == "stream":
        raise ModelLoadError(
            f"{type(model).__name__} does not route attention through transformers' AttentionInterface",
            hint="use --capture eager",
        )
    log.warning(
        "%s does not route attention through AttentionInterface; falling back to eager "
        "output_attentions (all layers' maps are kept until the end of each batch)",
        type(model).__name__,
    )
    return "eager"


def check_weights_present(model: Any) -> None:
    """A model whose weights are on the meta device (created empty, or offloaded by accelerate) has
    nothing to run: refused before any forward pass, saying what to do."""
    on_meta = [name for name, parameter in model.named_parameters() if parameter.device.type == "meta"]
    if on_meta:
        offloaded = hasattr(model, "hf_device_map") or any(hasattr(m, "_hf_hook") for m in model.modules())
        why = "offloaded by accelerate (device_map with disk or CPU offload)" if offloaded else "not loaded"
        raise InputError(
            f"{type(model).__name__}: {len(on_meta)} of its weights are on the meta device ({why}; "
            f"first: {on_meta[0]})",
            hint="load the weights (from_pretrained without offloading, or load_state_dict), or pass the "
            "model's folder as a spec with device_map='auto' so headscope loads it",
        )


def check_tokenizer_fits(model: Any, tokenizer: Any) -> None:
    """A tokenizer from another model would index past the embedding (an IndexError deep in torch)
    or, worse, run on the wrong ids: refused before any forward pass, naming both sizes."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embedding, "num_embeddings", None)
    if rows is None:
        return
    size = len(tokenizer)
    if size > rows:
        raise InputError(
            f"the tokenizer has {size:,} tokens but the model's embedding has {rows:,} rows: it is not this "
            "model's tokenizer (or tokens were added without model.resize_token_embeddings)",
            hint="pass the tokenizer the model was trained with",
        )
    outside = sorted({int(i) for i in tokenizer.all_special_ids if i is not None and not 0 <= int(i) < rows})
    if outside:
        raise InputError(
            f"the tokenizer's special token ids {', '.join(map(str, outside))} fall outside the model's "
            f"embedding of {rows:,} rows",
            hint="pass the tokenizer the model was trained with",
        )
