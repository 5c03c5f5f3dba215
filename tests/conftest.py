"""Shared fixtures. Models load once per session, never at import time."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Never the user's real cache: what an earlier run left there (a GGUF dequantized by an older
# headscope, say) must not change what the tests see. Each session gets a fresh cache, removed at
# exit. Subprocesses and pytest-xdist's workers inherit it through HEADSCOPE_TEST_CACHE, so each
# bundled GGUF is dequantized once per session (a lock in models.gguf makes a second process wait
# for the first). A developer may point HEADSCOPE_TEST_CACHE at a folder kept for tests only, to
# skip the dequantization on reruns; CI never sets it.
if os.environ.get("HEADSCOPE_TEST_CACHE"):
    TEST_CACHE = Path(os.environ["HEADSCOPE_TEST_CACHE"])
else:
    TEST_CACHE = Path(tempfile.mkdtemp(prefix="headscope-test-cache-"))
    atexit.register(shutil.rmtree, TEST_CACHE, ignore_errors=True)
    os.environ["HEADSCOPE_TEST_CACHE"] = str(TEST_CACHE)
os.environ["HEADSCOPE_CACHE"] = str(TEST_CACHE)

ROOT = Path(__file__).resolve().parents[1]
TOY_DIR = ROOT / "tests" / "toy" / "model"
TOY_TEXTS = ROOT / "tests" / "toy" / "symbols.txt"
SHARED_DATA = ROOT.parent / "shared" / "data"


class StaleExpensiveOutput(UserWarning):
    """An expensive output block older than the code that produces it, or never generated.

    Declared here, not in the test module that warns it: pytest-xdist's controller rebuilds each
    warning from its class' module, and it can import conftest but not a test module."""


def in_ci() -> bool:
    """CI services set ``CI`` (GitHub Actions: ``CI=true``); ``CI=false`` or ``0`` means not."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


# Hypothesis profiles. CI replays the same examples on every run (a red build can be rerun and
# reproduced; print_blob gives the exact failing example); development keeps exploring new ones.
# Tests set only what they need (max_examples, health checks) and inherit the rest from here.
# Both start from Hypothesis' own "default" profile: recent Hypothesis loads a built-in "ci"
# profile by itself when CI is set, and "dev" must not inherit that by accident. Our "ci" replaces
# the built-in one and keeps what it sets (no example database, no too_slow health check).
_BASE = settings.get_profile("default")
settings.register_profile("dev", _BASE, deadline=None)
settings.register_profile(
    "ci",
    _BASE,
    derandomize=True,
    print_blob=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "dev"))


def require_shared(relative: str | Path) -> Path:
    """The path of a file under ../shared/data/ (or an absolute path), for tests that read public data.

    Absent data skips the test on a developer's machine, but fails it when ``CI`` is set, so a
    green CI run always includes the checks on real treebanks and corpora.
    """
    path = SHARED_DATA / relative
    if not path.exists():
        message = f"{path} is absent (shared data next to the project root)"
        if in_ci():
            pytest.fail(message + "; CI must run the tests that read it")
        pytest.skip(message)
    return path


def repeat_kv_order(n_heads: int, n_kv_heads: int) -> list[int]:
    """The KV head that each query head reads, according to transformers itself.

    Runs ``repeat_kv``, the function Llama-family attention uses to expand K and V to the query
    heads, on KV heads that each carry their own index. This is the order that kv_group must
    follow, found without headscope's code.
    """
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    kv = torch.arange(n_kv_heads, dtype=torch.float32).view(1, n_kv_heads, 1, 1)
    return repeat_kv(kv, n_heads // n_kv_heads)[0, :, 0, 0].long().tolist()


def load_module(path: Path, name: str):
    """A script outside the package (scripts/docs.py, tests/toy/kv_toy.py) imported once as module
    ``name``, registered in ``sys.modules`` first (dataclasses look their module up by name)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def kv_toy_module():
    """tests/toy/kv_toy.py: the hand-built KV toy with planted retrieval and streaming heads."""
    return load_module(ROOT / "tests" / "toy" / "kv_toy.py", "headscope_kv_toy")


def word_tokenizer(size: int):
    """A word-level tokenizer over ``w0 … w{size-1}`` (w0 doubles as unknown), for tiny random
    models built in a test: ``hs.load(model, tokenizer)`` wants the model's tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=raw)


@pytest.fixture(autouse=True)
def forget_registrations():
    """What a test adds to the process' registries (hs.detect, hs.register) is gone after it, so no
    other test sees it (a name left by one test would be taken for the next one's in the same
    process)."""
    from headscope import detectors
    from headscope.extend.protocol import ANALYSES

    declared, analyses = set(detectors.DECLARATIONS), set(ANALYSES)
    yield
    for name in set(detectors.DECLARATIONS) - declared:
        del detectors.DECLARATIONS[name]
    for name in set(ANALYSES) - analyses:
        ANALYSES.unregister(name)


@pytest.fixture(scope="session")
def toy_truth() -> dict:
    return json.loads((TOY_DIR / "ground_truth.json").read_text())


@pytest.fixture(scope="session")
def toy():
    from headscope.models import load

    return load(str(TOY_DIR))


@pytest.fixture(scope="session")
def toy_eager():
    from headscope.models import load

    return load(str(TOY_DIR), capture="eager")


@pytest.fixture(scope="session")
def smollm2():
    from headscope.models import load

    return load("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_scan(smollm2):
    """One full scan of SmolLM2 (every detector, IOI with path patching, the short retrieval sweep,
    the weight-only roles; 200 resamples), run once and read by every test that checks a part of
    it: the scan itself, the IOI circuit, the copying and suppression heads. The suite's budget
    has room for one scan of the real model, not one per test."""
    from headscope import analyses

    return analyses.scan(smollm2, n_resamples=200)


@pytest.fixture(scope="session")
def gemma3():
    from headscope.models import load

    return load("gemma3-270m")


@pytest.fixture(scope="session")
def minilm():
    from headscope.models import load

    return load("minilm-l6")


@pytest.fixture(scope="session")
def toy_texts() -> Path:
    """Random symbol texts in the toy's vocabulary (natural text would be all <unk>)."""
    return TOY_TEXTS


@pytest.fixture(scope="session")
def toy_dir() -> Path:
    return TOY_DIR


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group the slow tests for pytest-xdist's ``--dist loadgroup``: a module's slow tests run in
    one worker, so a fixture it builds once (a trained toy, a loaded report) is built once, and the
    tests that read the shared SmolLM2 scan (directly or through a fixture) are one group, so the
    scan runs once. Only those tests: the rest of their modules (Gemma 3's weights, MiniLM's scan)
    is free to run beside the scan, which is the suite's longest group. A test that
    names its own ``xdist_group`` (the conformance families) keeps it; without xdist the marker is
    inert. ``tryfirst``: xdist's worker reads the markers in its own hook of this name, which would
    otherwise run first (checked: without it, test_circuit_data.py's two slow tests ran in two
    workers with no group in their node ids)."""
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    for item in slow:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.module.__name__
        group = "smollm2-scan" if "smollm2_scan" in item.fixturenames else f"slow:{module}"
        item.add_marker(pytest.mark.xdist_group(group))
