"""A library's deprecation notice (a newer transformers or peft than the constraints name) does not
land on stderr above headscope's one-line messages; ``--debug`` shows it."""

from __future__ import annotations

import warnings

import pytest

from headscope.errors import InputError
from headscope.outputs.terminal import reported, run_program


def _program():
    def program():
        # As transformers warns: attributed to the library's module, not to headscope.
        warnings.warn_explicit(
            "`foo` is deprecated and will be removed in v6", FutureWarning, "transformers/x.py", 1
        )
        warnings.warn_explicit("old peft API", DeprecationWarning, "peft/y.py", 1, module="peft.y")
        with reported(debug=False):
            raise InputError("--context 5: too short")

    return program


@pytest.mark.parametrize("debug", [False, True])
def test_library_deprecations_are_for_debug_only(monkeypatch, capsys, debug):
    monkeypatch.setenv("TQDM_DISABLE", "1")  # run_program sets it when unset; keep the test's env
    monkeypatch.setattr("sys.argv", ["headscope", "describe", *(["--debug"] if debug else [])])
    with warnings.catch_warnings(record=True) as shown:  # run_program's filters stay inside this test
        warnings.simplefilter("always")
        with pytest.raises(SystemExit) as ended:
            run_program(_program())
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --context 5: too short"
    categories = {w.category for w in shown}
    assert categories == ({FutureWarning, DeprecationWarning} if debug else set()), shown
