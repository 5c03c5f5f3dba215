"""Loading: model spec -> model, tokenizer and HeadLayout; the bundled aliases; the GGUF cache."""

from headscope.models.bundled import (
    BUNDLED,
    DEFAULT_MODEL,
    BundledModel,
    BundledPart,
    bundled_file,
    bundled_path,
    cache_root,
    file_digest,
)
from headscope.models.gguf import GGUF_CACHE_FORMAT, gguf_cache_dir, gguf_cache_is_valid
from headscope.models.layout import DeviceName, DtypeName, HeadLayout, LoadedModel
from headscope.models.load import is_causal_config, load
from headscope.models.spec import ResolvedSpec, resolve

__all__ = [
    "BUNDLED",
    "BundledModel",
    "BundledPart",
    "DEFAULT_MODEL",
    "DeviceName",
    "DtypeName",
    "GGUF_CACHE_FORMAT",
    "HeadLayout",
    "LoadedModel",
    "ResolvedSpec",
    "bundled_file",
    "bundled_path",
    "cache_root",
    "file_digest",
    "gguf_cache_dir",
    "gguf_cache_is_valid",
    "is_causal_config",
    "load",
    "resolve",
]
