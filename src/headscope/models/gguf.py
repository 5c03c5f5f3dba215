"""GGUF files: dequantized once, cached as float32 safetensors keyed by the file's hash."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from headscope.errors import ModelLoadError

from .bundled import cache_root, file_digest, log
from .spec import ResolvedSpec

# Bumped whenever what a GGUF cache entry holds changes; an entry with another format is rebuilt.
GGUF_CACHE_FORMAT = 1


_GGUF_CACHE_MARKER = "headscope.json"


def gguf_cache_dir(gguf_path: Path, digest: str | None = None) -> Path:
    """Where a GGUF file's dequantized weights are cached: keyed by its content (the first 32 hex
    digits of its SHA-256, ``digest`` where already known), so a changed file gets a new entry."""
    return cache_root() / "gguf" / (digest or file_digest(gguf_path))[:32]


def _safetensors_dtypes(path: Path) -> set[str]:
    """The tensor dtypes named in a safetensors header (8-byte length, then JSON); reads no tensor data."""
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if not 2 <= length <= 100 * 2**20:
            raise ValueError(f"{path} has no safetensors header")
        header = json.loads(handle.read(length))
    return {entry["dtype"] for key, entry in header.items() if key != "__metadata__"}


def gguf_cache_is_valid(entry: Path) -> bool:
    """True when a cache entry holds this format's float32 weights.

    Entries written before the marker existed stored the weights in whatever dtype that run asked
    for (a ``--dtype bfloat16`` run left bf16-rounded weights behind), so they are not trusted.
    """
    try:
        marker = json.loads((entry / _GGUF_CACHE_MARKER).read_text(encoding="utf-8"))
        if marker != {"format": GGUF_CACHE_FORMAT, "dtype": "float32"}:
            return False
        if not (entry / "config.json").is_file():
            return False
        return _safetensors_dtypes(entry / "model.safetensors") == {"F32"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _load_gguf(
    resolved: ResolvedSpec, dtype: Any, use_cache: bool, placement: dict[str, Any]
) -> tuple[Any, Any, str]:
    """Dequantize a GGUF once and keep the float32 result as safetensors, keyed by the file's content hash.

    The cache always holds float32, whatever ``dtype`` this run asks for; the requested dtype is
    applied when loading from the cache, so a cold and a warm run give the same weights.
    """
    gguf_path = Path(resolved.location) / str(resolved.gguf_file)
    cached = gguf_cache_dir(gguf_path, resolved.sha256) if use_cache else None
    with _building(cached):
        return _load_or_build(resolved, gguf_path, cached, dtype, placement)


@contextlib.contextmanager
def _building(entry: Path | None) -> Iterator[None]:
    """Hold a lock beside the cache entry while it is read or built, so that a second process
    (another test worker, a sweep's second worker) waits for the first instead of dequantizing
    the same file again. Without fcntl (Windows) or a writable cache, no lock: the entry is
    still written atomically, and the slower process finds it or writes the same bytes."""
    if entry is None or fcntl is None:
        yield
        return
    try:
        locks = entry.parent.parent / "locks"  # beside the entries, not among them
        locks.mkdir(parents=True, exist_ok=True)
        handle = open(locks / f"{entry.parent.name}-{entry.name}.lock", "a")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load_or_build(
    resolved: ResolvedSpec, gguf_path: Path, cached: Path | None, dtype: Any, placement: dict[str, Any]
) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def from_cache() -> tuple[Any, Any]:
        tok = AutoTokenizer.from_pretrained(cached)
        model = AutoModelForCausalLM.from_pretrained(
            cached, attn_implementation="eager", dtype=dtype, **placement
        )
        return model, tok

    if cached is not None and cached.exists():
        if gguf_cache_is_valid(cached):
            try:
                model, tok = from_cache()
                return model, tok, f"{gguf_path} (dequantized cache {cached})"
            except Exception as exc:  # a damaged cache entry is rebuilt, not fatal
                log.warning("ignoring unreadable GGUF cache %s: %s", cached, exc)
        else:
            log.info("rebuilding GGUF cache %s: written by an older headscope or in another dtype", cached)
        shutil.rmtree(cached, ignore_errors=True)
    load_dtype = torch.float32 if cached is not None else dtype
    try:
        with _one_parse():
            tok = AutoTokenizer.from_pretrained(resolved.location, gguf_file=resolved.gguf_file)
            model = AutoModelForCausalLM.from_pretrained(
                resolved.location,
                gguf_file=resolved.gguf_file,
                attn_implementation="eager",
                dtype=load_dtype,
                **placement,
            )
    except ImportError as exc:
        raise ModelLoadError(f"cannot read {gguf_path}: {exc}", hint="pip install gguf accelerate") from exc
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read GGUF file {gguf_path}: {type(exc).__name__}: {exc}",
            hint="is the file complete and a model architecture that transformers supports?",
        ) from exc
    if cached is None or load_dtype == dtype:
        if cached is not None:
            _write_gguf_cache(model, tok, cached)
        return model, tok, str(gguf_path)
    # Another dtype: write float32, then load the cache entry exactly as a warm run would.
    if _write_gguf_cache(model, tok, cached):
        del model
        try:
            model, tok = from_cache()
            return model, tok, str(gguf_path)
        except Exception as exc:
            raise ModelLoadError(f"cannot reload the dequantized cache {cached}: {exc}") from exc
    return model.to(dtype), tok, str(gguf_path)


_PARSING = threading.Lock()


@contextlib.contextmanager
def _one_parse() -> Iterator[None]:
    """Parse the GGUF once for one load.

    transformers reads the file's header three times for one load (the tokenizer, the config, the
    weights: ``load_gguf_checkpoint`` builds a new ``gguf.GGUFReader`` each time). The parse walks
    every metadata entry in Python, and Gemma 3's 262,144-entry vocabulary made it most of a cold
    load: the three parses took about 60 s, the dequantization 4.5 s (cProfile, 2026-12-05). Here
    ``gguf.GGUFReader`` is, until the load ends, a function that hands the first reader of a path
    to the later calls (read-only: transformers reads fields and tensors from it). The swap is held
    under a lock, so two threads loading at once take turns instead of restoring each other's
    function; the reader is the library's own class, and nothing of the swap outlives the load.
    """
    try:
        import gguf
    except ImportError:  # transformers says what to install
        yield
        return
    with _PARSING:
        original = gguf.GGUFReader
        readers: dict[tuple[str, str], Any] = {}

        def reader(path: Any, mode: str = "r") -> Any:
            key = (os.path.realpath(os.fspath(path)), mode)
            if key not in readers:
                readers[key] = original(path, mode)
            return readers[key]

        gguf.GGUFReader = reader
        try:
            yield
        finally:
            gguf.GGUFReader = original
            readers.clear()


def _write_gguf_cache(model: Any, tokenizer: Any, target: Path) -> bool:
    """Save the dequantized float32 weights as a plain HF folder; return whether the entry exists.

    ``save_pretrained`` refuses GGUF-quantized models, so the config (minus its GGUF
    quantization entry) and the tensors are written directly. The folder is staged under a
    temporary name and renamed, so a crash never leaves half a cache entry. ``headscope.json``
    marks the entry as this format's float32 weights.
    """
    import copy

    import torch
    from safetensors.torch import save_model

    dtypes = {parameter.dtype for parameter in model.parameters()}
    if dtypes != {torch.float32}:  # a programming error, never a user's: refuse to poison the cache
        raise ModelLoadError(f"refusing to cache GGUF weights in {dtypes}; the cache holds float32")
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
        marker = {"format": GGUF_CACHE_FORMAT, "dtype": "float32"}
        (staging / _GGUF_CACHE_MARKER).write_text(json.dumps(marker), encoding="utf-8")
        os.replace(staging, target)
        return True
    except OSError as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if gguf_cache_is_valid(target):  # another process wrote the same entry first
            return True
        log.warning("could not cache the dequantized GGUF under %s: %s", target, exc)
        return False
