"""The test suite's own support in conftest.py: shared data and hypothesis profiles behave in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_DATA, in_ci, require_shared
from hypothesis import settings


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("0", False), ("false", False), ("true", True), ("1", True)],
)
def test_in_ci_reads_the_ci_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is expected


def test_missing_shared_data_fails_in_ci_and_skips_elsewhere(monkeypatch, tmp_path):
    missing = tmp_path / "ud" / "absent.conllu"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="absent.conllu is absent"):
        require_shared(missing)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="absent.conllu is absent"):
        require_shared(missing)
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require_shared(missing)


def test_present_shared_data_is_returned(monkeypatch, tmp_path):
    import conftest

    (tmp_path / "ud").mkdir()
    present = tmp_path / "ud" / "data.conllu"
    present.write_text("x")
    monkeypatch.setenv("CI", "true")
    assert require_shared(present) == present
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path)
    assert require_shared("ud/data.conllu") == present  # relative paths are under ../shared/data
    assert SHARED_DATA.parts[-2:] == ("shared", "data")


def test_hypothesis_profiles():
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.print_blob and ci.deadline is None and ci.database is None
    dev = settings.get_profile("dev")
    assert not dev.derandomize and dev.deadline is None and dev.database is not None
    # The profile conftest.py loaded is the default, and the fuzz settings inherit from it.
    from test_fuzz import FUZZ

    assert FUZZ.derandomize == settings.default.derandomize
    assert FUZZ.max_examples == 80


@pytest.mark.parametrize(
    ("env", "derandomized"),
    [
        ({"CI": "true"}, True),
        ({}, False),
        ({"CI": "true", "HYPOTHESIS_PROFILE": "dev"}, False),  # an explicit profile wins
        ({"HYPOTHESIS_PROFILE": "ci"}, True),
    ],
)
def test_the_environment_chooses_the_profile(env, derandomized):
    """A fresh interpreter imports conftest.py as pytest does, with CI's environment or not."""
    tests = Path(__file__).resolve().parents[1]
    code = "import conftest; from hypothesis import settings; print(settings.default.derandomize)"
    clean = {k: v for k, v in os.environ.items() if k not in {"CI", "HYPOTHESIS_PROFILE"}}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tests,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.stdout.strip() == str(derandomized), proc.stderr


def test_the_session_never_uses_the_users_cache():
    from conftest import TEST_CACHE

    from headscope.models import cache_root

    assert cache_root() == TEST_CACHE
    assert cache_root() != Path.home() / ".cache" / "headscope"


def _pytest(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_xdist_keeps_a_group_in_one_worker(tmp_path):
    """make test relies on ``--dist loadgroup`` to build each module fixture and the shared scan
    once. pytest 9.2 with pytest-xdist 3.8 ignored every group (xdist renames the node id through
    an attribute pytest 9.2 no longer reads): six tests of one group went to both workers."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_group.py").write_text(
        "import os\nfrom pathlib import Path\nimport pytest\n\n"
        "pytestmark = pytest.mark.xdist_group('one')\n\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_worker(i):\n"
        "    Path(os.environ['OUT'], str(i)).write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    proc = _pytest(["-n", "2", "--dist", "loadgroup", str(tmp_path)], tmp_path, OUT=str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {path.read_text() for path in out.iterdir()}
    assert len(list(out.iterdir())) == 6 and len(workers) == 1, workers


def test_slow_tests_are_grouped_by_module_and_the_scan_readers_together(tmp_path):
    """conftest's hook: a slow module's tests share one group; the tests that read the shared
    SmolLM2 scan share one (the rest of their module keeps its own); fast tests get none (they
    spread over the workers one by one)."""
    (tmp_path / "groups_plugin.py").write_text(
        "import pytest\n\n"
        "@pytest.hookimpl(trylast=True)\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    for item in items:\n"
        "        names = [m.args[0] for m in item.iter_markers('xdist_group')]\n"
        "        print('GROUP', item.nodeid, names[0] if names else '-')\n"
    )
    modules = [
        "tests/integration/test_gguf_cache.py",
        "tests/integration/test_circuits_real.py",
        "tests/integration/test_real_models.py",
        "tests/unit/test_test_support.py",
    ]
    proc = _pytest(
        ["--collect-only", "-s", "-p", "groups_plugin", *modules],
        Path(__file__).resolve().parents[2],
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    groups: dict[str, set[str]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("GROUP "):
            _, nodeid, group = line.split(" ")
            groups.setdefault(nodeid.split("::")[0], set()).add(group)
    assert groups["tests/integration/test_gguf_cache.py"] == {"slow:test_gguf_cache"}
    assert groups["tests/integration/test_circuits_real.py"] == {"smollm2-scan"}
    # Its scan test reads the scan; its MiniLM and induction tests do not.
    assert groups["tests/integration/test_real_models.py"] == {"smollm2-scan", "slow:test_real_models"}
    assert groups["tests/unit/test_test_support.py"] == {"-"}
