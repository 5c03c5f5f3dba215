"""``Result.from_json(path, run=...)``: ``run`` names one run of a sweep store; with a plain result
file it is refused, not ignored."""

from __future__ import annotations

import pytest
from conftest import TOY_DIR

import headscope as hs
from headscope.errors import InputError


def test_run_with_a_plain_result_file_is_refused(tmp_path):
    path = tmp_path / "induction.json"
    hs.induction(str(TOY_DIR), resamples=0).to_json(path)
    assert hs.Result.from_json(path).analysis == "induction"
    with pytest.raises(InputError, match="run='toy': .* is one saved result, not a sweep store"):
        hs.Result.from_json(path, run="toy")  # before: the run was ignored
