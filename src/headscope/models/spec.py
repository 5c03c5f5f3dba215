"""Resolve what the user typed (alias, .gguf file, local folder, hub id) into something to load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from headscope.errors import ModelNotFoundError

from .bundled import BUNDLED, bundled_file


@dataclass(frozen=True)
class ResolvedSpec:
    kind: Literal["gguf", "dir", "hub", "adapter"]
    location: str  # directory (gguf/dir/adapter) or hub id
    gguf_file: str | None = None
    alias: str | None = None
    sha256: str | None = None  # the GGUF file's digest when already verified (saves hashing it again)
    base: str | None = None  # adapter: the spec of the model the adapter was trained on


ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_folder(path: Path) -> bool:
    """A peft adapter as saved by ``save_pretrained`` (a trainer's checkpoint-N folder of a LoRA run)."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def adapter_base(path: Path) -> str:
    """The base model an adapter folder names (``base_model_name_or_path``), as a spec."""
    import json

    try:
        base = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"{path / ADAPTER_CONFIG}: cannot read it ({exc})") from exc
    if not base:
        raise ModelNotFoundError(
            f"{path / ADAPTER_CONFIG} names no base_model_name_or_path",
            hint="set it to the base model's alias, folder or cached hub id",
        )
    return str(base)


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
            return ResolvedSpec("adapter", str(path.resolve()), base=adapter_base(path))
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
