"""Conformance: one tiny random model per transformers family, through every public analysis.

For each family in ``families.FAMILIES``: streaming capture equals eager attention on a right-padded
batch split into small query chunks; the decomposition checks (maps, DLA, OV) come back ok or refuse
as recorded; every analysis returns a non-empty table or refuses with a ``HeadscopeError`` (a crash
is allowed only where ``KNOWN_CRASH`` records it, until it is fixed); the head layout matches the
config and the K projection. Each family is built and run once per session (``families.report``),
and ``docs/reference/architectures.md`` must be what those reports render to: each family's row is
compared in the process that built its report (``make test`` runs pytest-xdist with
``--dist loadgroup``, and every test of one family is in that family's group), so no report is
built twice.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_NAME = "headscope_conformance_families"


def _load_families():
    """families.py by path (this folder is not a package), one module object per process."""
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).with_name("families.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_NAME]


F = _load_families()
# One xdist group per family: its five tests and its docs row run on one worker, which builds the
# family's report once (without --dist loadgroup the mark does nothing and each worker builds what
# it needs).
FAMILIES = [pytest.param(family, marks=pytest.mark.xdist_group(family)) for family in F.FAMILIES]
STREAM_TOLERANCE = 1e-5
# Attention that SDPA cannot compute (Gemma 2's logit soft-cap, GPT-OSS's sink column): every row exact.
SELECTIVE_NEVER = {"gemma2", "gpt_oss"}
FIX_HINT = (
    "update the expectations in tests/conformance/families.py (python scripts/architectures.py "
    "--expectations prints them as they are now), then run python scripts/architectures.py"
)


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_and_stream_equals_eager(family):
    rep = F.report(family)
    expected_capture = "eager" if family in F.EAGER else "stream"
    assert rep.capture == expected_capture, f"{family}: capture auto chose {rep.capture}; {FIX_HINT}"
    if rep.capture != "stream":
        return
    error = rep.stream_eager_error
    for outcome, known in (("refused", F.STREAM_REFUSES), ("crashed", F.STREAM_CRASH)):
        if family in known:
            assert error is not None, f"{family}: streaming now equals eager; {FIX_HINT}"
            assert error.outcome == outcome and known[family] in error.detail, (
                f"{family}: expected streaming {outcome} ({known[family]!r}), got {error.outcome}: {error.detail}"
            )
            return
    assert error is None, f"{family}: streaming {error.outcome}: {error.detail}"
    assert rep.stream_eager is not None and rep.stream_eager <= STREAM_TOLERANCE, (
        f"{family}: streamed maps differ from eager by {rep.stream_eager}"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_query_selective_capture_equals_full_maps(family):
    """Every analysis that runs gives the same table (scores, intervals, DLA, roles) to 1e-6 when
    only the rows its readers declare get exact weights as when every row does."""
    rep = F.report(family)
    if not any(o.outcome == "ran" for o in rep.analyses.values()):
        pytest.skip(f"{family}: no analysis runs")
    if family in F.EAGER or family in SELECTIVE_NEVER:
        # Eager capture hands on the model's own maps; a soft-cap or sink column keeps every row
        # exact. Either way there is no fused row, so nothing to compare.
        assert not rep.selective_full, f"{family}: rows ran fused; take it out of SELECTIVE_NEVER"
        return
    assert rep.selective_full, f"{family}: no analysis sent a row through the fused kernel"
    wrong = {name: gap for name, gap in rep.selective_full.items() if not gap <= 1e-6}
    assert not wrong, f"{family}: selective capture differs from full maps: {wrong}"


@pytest.mark.parametrize("family", FAMILIES)
def test_decomposition_checks(family):
    rep = F.report(family)
    if rep.checks is None:
        pytest.skip("headscope.capture.checks is not there yet")
    expected = F.CHECKS.get(family, {})
    wrong = []
    for view in F.VIEWS:
        got = rep.checks[view]
        outcome, reason = expected.get(view, ("ok", ""))
        if got.outcome != outcome or reason not in got.detail:
            wrong.append(f"{view}: expected {outcome} ({reason!r}), got {got.outcome}: {got.detail}")
    assert not wrong, f"{family}:\n  " + "\n  ".join(wrong) + f"\n{FIX_HINT}"


@pytest.mark.parametrize("family", FAMILIES)
def test_qk_pullback_equals_the_projection_oracle(family):
    """qk's shares come from one pull-back per head and side; projecting every source through the
    queries and keys (the path it replaced) gives the same shares to 1e-6 on every family it runs on."""
    rep = F.report(family)
    if rep.analyses["qk"].outcome != "ran":
        pytest.skip(f"{family}: qk does not run")
    assert rep.qk_oracle is not None and rep.qk_oracle <= 1e-6, (
        f"{family}: pull-back vs oracle {rep.qk_oracle}"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_every_analysis_runs_or_refuses_cleanly(family):
    rep = F.report(family)
    expected = F.expected_analyses(family)
    wrong = []
    for analysis, got in rep.analyses.items():
        outcome, reason = expected[analysis]
        if got.outcome != outcome or reason not in got.detail:
            wrong.append(f"{analysis}: expected {outcome} ({reason!r}), got {got.outcome}: {got.detail}")
    assert not wrong, f"{family}:\n  " + "\n  ".join(wrong) + f"\n{FIX_HINT}"


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_matches_config_and_k_projection(family):
    problems = F.layout_problems(F.report(family).layout)
    known = F.LAYOUT_WRONG.get(family)
    if known is None:
        assert not problems, f"{family}: " + "; ".join(problems)
    else:
        assert problems, f"{family}: layout is right now; {FIX_HINT}"
        assert any(known in p for p in problems), problems


def _committed_rows() -> dict[str, str]:
    text = F.DOC_PATH.read_text() if F.DOC_PATH.exists() else ""
    return {
        line.split("|")[1].strip(): line
        for line in text.splitlines()
        if line.startswith("| ") and "---" not in line
    }


STALE = f"is out of date with what the code does now: run python scripts/architectures.py ({F.DOC_PATH})"


def test_docs_table_lists_every_family_under_its_header():
    """The page is the header, then one row per family in FAMILIES' order (each row's content is
    compared by test_docs_row_is_current, where the family's report is built anyway)."""
    committed = F.DOC_PATH.read_text() if F.DOC_PATH.exists() else ""
    header = F.markdown([])
    assert committed.startswith(header), f"the table's header {STALE}"
    rows = committed[len(header) :].splitlines()
    assert [line.split("|")[1].strip() for line in rows] == list(F.FAMILIES), f"the table's families {STALE}"


@pytest.mark.parametrize("family", FAMILIES)
def test_docs_row_is_current(family):
    committed = _committed_rows().get(family)
    assert committed == F.row(F.report(family)), f"{family}'s row {STALE}"
