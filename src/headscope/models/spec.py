"""Resolve what the user typed (alias, .gguf file, local folder, hub id) into something to load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from headscope.errors import InputError, ModelNotFoundError, elide

from .bundled import BUNDLED, bundled_file


@dataclass(frozen=True)
class ResolvedSpec:
    kind: Literal["gguf", "dir", "hub", "adapter"]
    location: str  # directory (gguf/dir/adapter) or hub id
    gguf_file: str | None = None
    alias: str | None = None
    sha256: str | None = None  # the GGUF file's digest when already verified (saves hashing it again)
    # adapter: the spec of the model under the whole chain of adapters (never an adapter itself)
    base: str | None = None
    # adapter: the adapter folders between that base and this one, innermost first (an adapter whose
    # base_model_name_or_path names another adapter folder was trained on that adapter's model)
    inner: tuple[str, ...] = ()


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MAX_ADAPTER_CHAIN = 16


# A full model's weights (an adapter folder that holds none of these is an adapter, even when a
# trainer saved the base's config.json and tokenizer beside it).
MODEL_WEIGHTS = ("model*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin", "*.gguf")


def is_adapter_folder(path: Path) -> bool:
    """A peft adapter as saved by ``save_pretrained`` (a trainer's checkpoint-N folder of a LoRA run)."""
    if not (path / ADAPTER_CONFIG).is_file():
        return False
    if not (path / "config.json").is_file():
        return True
    return not any(any(path.glob(pattern)) for pattern in MODEL_WEIGHTS)


def adapter_base(path: Path) -> str:
    """The base model an adapter folder names (``base_model_name_or_path``), as a spec."""
    import json

    config = path / ADAPTER_CONFIG
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{config}: cannot read it ({elide(exc)})", hint="save the adapter again with save_pretrained"
        ) from None
    except RecursionError:
        raise InputError(f"{config}: nested too deeply; not a peft adapter config") from None
    if not isinstance(data, dict):
        raise InputError(
            f"{config}: expected a JSON object (a peft adapter config), got {elide(data, 40)}",
            hint="save the adapter again with save_pretrained",
        )
    base = data.get("base_model_name_or_path")
    if base is not None and not isinstance(base, str):
        raise InputError(
            f"{config}: base_model_name_or_path must be a string, got {elide(base, 40)}",
            hint="set it to the base model's alias, folder or cached hub id",
        )
    if not base:
        raise ModelNotFoundError(
            f"{config} names no base_model_name_or_path",
            hint="set it to the base model's alias, folder or cached hub id",
        )
    return base


def check_adapter_weights(path: Path) -> None:
    """An adapter folder holds its weights (peft would say "Repo id must be in the form…")."""
    if not any((path / name).is_file() for name in ADAPTER_WEIGHTS):
        raise InputError(
            f"{path}: an adapter folder (it holds {ADAPTER_CONFIG}) without adapter weights "
            f"({' or '.join(ADAPTER_WEIGHTS)})",
            hint="give the folder save_pretrained wrote, with its weights",
        )


def _adapter(path: Path) -> ResolvedSpec:
    """An adapter folder, and the chain of adapters under it down to a model that is not one. A
    chain that comes back to a folder it passed is refused (it names no model to start from)."""
    folder = path.resolve()
    chain = [folder]
    check_adapter_weights(folder)
    base = adapter_base(folder)
    while True:
        below = Path(base).expanduser()
        if not (below.is_dir() and is_adapter_folder(below)):
            break
        below = below.resolve()
        if below in chain:
            loop = " -> ".join(str(p) for p in [*chain, below])
            raise InputError(
                f"{chain[-1] / ADAPTER_CONFIG}: base_model_name_or_path leads back to {below}, an adapter "
                f"already in the chain ({elide(loop, 300)}): no base model to start from",
                hint="set base_model_name_or_path to the model the adapter was trained on",
            )
        if len(chain) >= MAX_ADAPTER_CHAIN:
            raise InputError(f"{path}: more than {MAX_ADAPTER_CHAIN} adapters stacked on one another")
        check_adapter_weights(below)
        chain.append(below)
        base = adapter_base(below)
    return ResolvedSpec("adapter", str(folder), base=base, inner=tuple(str(p) for p in reversed(chain[1:])))


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
        if is_adapter_folder(path):
            return _adapter(path)
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
