"""``headscope report`` holds every result it is given, or writes nothing: a page that says "wrote"
contains each result named. Two results share a page only as two describe results (issue 55, item
6: a scan and an atlas once made a page with the second model nowhere on it); a third result, a
``--model`` the page does not use, a ``--run`` with no sweep store are refused before anything is
read or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headscope as hs
from headscope.analyses import ANALYSES
from headscope.cli import app
from headscope.errors import InputError

runner = CliRunner()


@pytest.fixture(scope="module")
def saved(toy, toy_texts, tmp_path_factory) -> dict[str, Path]:
    """A describe result, a scan that described its heads without a role (so it has an atlas too),
    and a scan without one, each saved as --format json."""
    folder = tmp_path_factory.mktemp("report-given")
    made = {
        "describe": hs.describe(toy, eval_text=toy_texts, context=96, windows=4, resamples=0),
        "scan": hs.scan(toy, text=toy_texts, resamples=0, weights=False, describe=2),
        "scan-bare": hs.scan(
            toy, detectors="previous-token", text=toy_texts, resamples=0, weights=False, describe=0
        ),
    }
    assert made["scan"].atlas is not None and made["scan-bare"].atlas is None
    paths = {}
    for name, result in made.items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(result.to_json(), encoding="utf-8")
    return paths


def _report(*args: object) -> tuple[int, str]:
    done = runner.invoke(app, ["report", *(str(a) for a in args)])
    return done.exit_code, " ".join(done.output.split())


@pytest.mark.parametrize(
    ("first", "second"),
    [("scan", "describe"), ("describe", "scan"), ("scan", "scan"), ("scan-bare", "describe")],
)
def test_a_pair_one_page_cannot_hold_is_refused_before_anything_is_written(saved, tmp_path, first, second):
    """The issue's case and its mirror: scan's page draws nothing of a second result, and describe's
    page would draw a scan's atlas without its tables. One line, exit 2, no file."""
    page = tmp_path / "two.html"
    code, output = _report(saved[first], saved[second], "--html", page)
    assert code == 2, output
    analyses = [name.split("-")[0] for name in (first, second)]
    assert f"{analyses[0]} of model and {analyses[1]} of model cannot share one page" in output
    assert "only two describe results stand side by side" in output
    assert "headscope report RESULT --html PAGE" in output  # what to do instead
    assert "wrote" not in output and not page.exists()


def test_two_describe_results_still_share_a_page(saved, tmp_path):
    page = tmp_path / "two.html"
    code, output = _report(saved["describe"], saved["describe"], "--html", page)
    assert code == 0, output
    assert "data-testid=beside" in page.read_text(encoding="utf-8")


def test_every_pair_of_result_kinds_but_two_describe_results_is_refused(saved):
    """The rule holds in its class: every registered analysis against every other (each relabelled
    from the describe result, so each has an atlas, the case the old check let through). Only the
    analyses that declare ``draws_beside`` (describe) share their page, with their own kind."""
    document = json.loads(saved["describe"].read_text(encoding="utf-8"))
    assert [name for name in ANALYSES if ANALYSES[name].draws_beside] == ["describe"]
    for first in ANALYSES:
        for second in ANALYSES:
            a = hs.Result.from_json({**document, "command": first})
            b = hs.Result.from_json({**document, "command": second})
            if first == second == "describe":
                assert "data-testid=beside" in a.html(examples=False, beside=b)
                continue
            with pytest.raises(InputError, match=f"^{first} of model and {second} of model cannot share"):
                a.html(examples=False, beside=b)


def test_the_second_results_reading_notes_are_on_the_page(saved, tmp_path):
    """The second result's notes, its own and the one reading it left (written by a newer headscope),
    are on the page, named, as the first's are: nothing of the second is left out."""
    document = json.loads(saved["describe"].read_text(encoding="utf-8"))
    major, minor, *_ = str(document["headscope"]).split(".")
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**document, "headscope": f"{major}.{int(minor) + 1}.0"}), encoding="utf-8")
    note = hs.Result.from_json(newer).notes
    assert note, "a newer minor version leaves a note"
    page = tmp_path / "two.html"
    code, output = _report(saved["describe"], newer, "--html", page)
    assert code == 0, output
    text = page.read_text(encoding="utf-8")
    assert "the second result (describe of model): this result was written by headscope" in text
    assert "the second result (describe of model): --resamples 0" in text  # its own notes too


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        # A third result: refused by count, before any file is read (none of these exists).
        (["missing", "missing", "missing"], "report: 3 results given"),
        # --model with two results: their page draws no model's heatmaps.
        (["describe", "describe", "--model", "tests/toy/model"], "--model names the model of one result's"),
        # --model with --no-examples: the heatmaps it names are left out.
        (["scan", "--model", "tests/toy/model", "--no-examples"], "--no-examples leaves them out"),
        # --run with no sweep store: there is no run to pick.
        (["scan", "--run", "last", "--no-examples"], "--run picks a run of a sweep store, and no sweep"),
    ],
    ids=["third-result", "model-for-two", "model-without-examples", "run-without-store"],
)
def test_an_input_the_page_would_leave_out_is_refused_before_reading(saved, tmp_path, args, refusal):
    page = tmp_path / "r.html"
    files = {**saved, "missing": tmp_path / "missing.json"}
    code, output = _report(*(files.get(a, a) for a in args), "--html", page)
    assert code == 2 and refusal in output, output
    assert not page.exists()
