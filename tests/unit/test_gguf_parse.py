"""One GGUF parse per load (models.gguf._one_parse): transformers builds a new ``gguf.GGUFReader``
for the tokenizer, the config and the weights; within one load the first reader of a path is handed
to the later calls, and ``gguf.GGUFReader`` is the library's own class again afterwards, error or not.
The real cold loads in tests/integration/test_gguf_cache.py count one parse each."""

from __future__ import annotations

import threading

import gguf
import pytest

from headscope.models.gguf import _one_parse


class Counting:
    made: list[tuple[str, str]] = []

    def __init__(self, path, mode="r"):  # noqa: ANN001
        Counting.made.append((str(path), mode))


def test_one_reader_per_path_within_a_load_and_the_class_comes_back(monkeypatch, tmp_path):
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    Counting.made = []
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with _one_parse():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first  # the same file by another spelling
        assert gguf.GGUFReader(b) is not first
        assert gguf.GGUFReader(a, "r+") is not first  # another mode is another reader
    assert gguf.GGUFReader is Counting
    assert Counting.made == [(str(a), "r"), (str(b), "r"), (str(a), "r+")]
    gguf.GGUFReader(a)  # after the load, a new parse again
    assert len(Counting.made) == 4


def test_an_error_inside_the_load_still_restores_the_class(monkeypatch):
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    with pytest.raises(RuntimeError), _one_parse():
        assert gguf.GGUFReader is not Counting
        raise RuntimeError("the load failed")
    assert gguf.GGUFReader is Counting


def test_two_threads_loading_at_once_take_turns(monkeypatch):
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    inside, release = threading.Event(), threading.Event()
    seen: list[object] = []

    def first() -> None:
        with _one_parse():
            inside.set()
            release.wait(5)

    def second() -> None:
        with _one_parse():
            seen.append(gguf.GGUFReader)

    one = threading.Thread(target=first)
    one.start()
    inside.wait(5)
    two = threading.Thread(target=second)
    two.start()
    two.join(0.2)
    assert two.is_alive()  # waits for the first load's swap to end
    release.set()
    one.join(5)
    two.join(5)
    assert gguf.GGUFReader is Counting and len(seen) == 1 and seen[0] is not Counting
