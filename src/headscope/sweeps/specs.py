"""What a sweep runs: model specs expanded into targets (one model or checkpoint each).

A SPEC is one of

* anything :func:`headscope.models.load` takes (alias, ``.gguf``, local HF folder, cached hub id);
* a folder whose sub-folders are checkpoints (``runs/toy/`` → ``step-0100``, ``step-0200``, …),
  ordered by the number in their names; the number is the checkpoint's step;
* ``hub-id@rev1,rev2,…``: revisions already in the local Hugging Face cache.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from headscope.errors import InputError

_NUMBER = re.compile(r"(\d+)")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


@dataclass(frozen=True)
class Target:
    """One model to analyse: how to load it, what to call it, and its step (when a checkpoint)."""

    spec: str  # what load() takes
    label: str  # the model name in sweep.csv: the spec, or series/checkpoint
    series: str  # runs of one training run (or one model) share a series
    step: int | None = None
    revision: str | None = None

    @property
    def key(self) -> str:
        """A file-name-safe, unique name for this target."""
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.label).strip("_")[-80:] or "model"
        digest = hashlib.sha256(f"{self.spec}@{self.revision}".encode()).hexdigest()[:8]
        return f"{slug}-{digest}"


def _is_model_folder(path: Path) -> bool:
    """A model, or a peft adapter (a LoRA trainer's checkpoint-N folders hold adapter_config.json)."""
    return (
        (path / "config.json").is_file()
        or (path / "adapter_config.json").is_file()
        or any(path.glob("*.gguf"))
    )


def _step_of(name: str) -> int | None:
    numbers = _NUMBER.findall(name)
    return int(numbers[-1]) if numbers else None


def expand(specs: list[str]) -> list[Target]:
    """Every target of every SPEC, in order (checkpoints by step)."""
    if not specs:
        raise InputError("give at least one SPEC: a model, a folder of checkpoints, or hub-id@rev1,rev2")
    targets: list[Target] = []
    for spec in specs:
        path = Path(spec).expanduser()
        if path.is_dir() and not _is_model_folder(path):
            children = [c for c in path.iterdir() if c.is_dir() and _is_model_folder(c)]
            if not children:
                raise InputError(
                    f"{spec}: folder holds no model and no checkpoint sub-folders",
                    hint="a checkpoint folder holds config.json, adapter_config.json or a .gguf file",
                )
            unnumbered = [c.name for c in children if _step_of(c.name) is None]
            if unnumbered:
                raise InputError(
                    f"{spec}: checkpoint folder '{unnumbered[0]}' has no number in its name",
                    hint="name checkpoints by step, e.g. step-0100",
                )
            children.sort(key=lambda c: (_step_of(c.name), c.name))
            for before, after in zip(children, children[1:], strict=False):
                if _step_of(before.name) == _step_of(after.name):
                    # one series, one score per step: two checkpoints at a step would be mixed
                    raise InputError(
                        f"{spec}: checkpoints '{before.name}' and '{after.name}' both have step "
                        f"{_step_of(before.name)}",
                        hint="keep one checkpoint per step in the folder, or give them as separate specs",
                    )
            series = path.name
            targets += [Target(str(c), f"{series}/{c.name}", series, _step_of(c.name)) for c in children]
        elif "@" in spec and not path.exists():
            hub_id, _, revisions = spec.partition("@")
            revs = [r.strip() for r in revisions.split(",") if r.strip()]
            if not hub_id or not revs:
                raise InputError(f"{spec}: expected hub-id@rev1,rev2,…")
            targets += [
                Target(
                    hub_id, f"{hub_id}@{rev}", hub_id, _step_of(rev) if _step_of(rev) is not None else i, rev
                )
                for i, rev in enumerate(revs)
            ]
        else:
            targets.append(Target(spec, spec, spec))
    keys = [t.key for t in targets]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        raise InputError(f"the same model is given twice ({duplicate})")
    return targets


def check_series(specs: list[str]) -> None:
    """``--png`` draws roles against training steps: refused, from the specs alone (before the first
    run, not after the sweep), unless they hold a series of two or more checkpoints."""
    stepped: dict[str, set] = {}
    for target in expand(list(specs)):
        if target.step is not None:
            stepped.setdefault(target.series, set()).add(target.step)
    if not any(len(steps) >= 2 for steps in stepped.values()):
        raise InputError(
            "--png draws roles against training steps, and these specs hold no series of two or "
            "more checkpoints",
            hint="give a folder of checkpoint-N folders, or drop --png",
        )


def fingerprint(target: Target) -> str:
    """A cheap digest of everything a target loads: for each weight, config and tokenizer file, its
    name, size and the SHA-256 of its first and last MiB (hashing multi-GB checkpoints whole would
    cost minutes). An adapter's covers its config and weights, the adapters it stacks on, and its
    base model's files; a cached hub model's, the commit its cache holds."""
    from headscope.models.spec import resolve

    if target.revision is not None:
        return _hub(target.spec, target.revision) or f"revision:{target.revision}"
    resolved = resolve(target.spec)
    if resolved.kind == "adapter":
        parts = [_files_digest(Path(folder)) for folder in (*resolved.inner, resolved.location)]
        base = fingerprint(Target(resolved.base or "", resolved.base or "", resolved.base or ""))
        digest = hashlib.sha256("|".join([*parts, base]).encode()).hexdigest()[:32]
        return f"adapter:{digest}"
    location = Path(resolved.location)
    if resolved.sha256:
        return f"sha256:{resolved.sha256}"
    if resolved.gguf_file:
        return "head-tail:" + _head_tail([location / resolved.gguf_file])
    if location.is_dir():
        return _files_digest(location)
    return _hub(resolved.location, None) or f"hub:{resolved.location}"


_CONFIG_NAMES = ("vocab.txt", "merges.txt")


def _files_digest(folder: Path) -> str:
    """The weights (at any depth) and the JSON configs and tokenizer files (beside them) of a model
    or adapter folder."""
    weights = {p for p in folder.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES}
    configs = {
        p
        for p in folder.iterdir()
        if p.is_file() and (p.suffix in (".json", ".model") or p.name in _CONFIG_NAMES)
    }
    files = sorted(weights | configs)
    return "head-tail:" + _head_tail(files)


def _head_tail(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(1 << 20))
            if size > 2 << 20:
                handle.seek(-(1 << 20), 2)
                digest.update(handle.read())
    return digest.hexdigest()[:32]


def _hub(repo_id: str, revision: str | None) -> str | None:
    """``hub:ID@COMMIT`` for a hub model in the local cache (a branch that moved is a new commit)."""
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(repo_id, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or no hub library): the run itself will say so
        return None
    return f"hub:{repo_id}@{Path(folder).name}"
