"""`headscope describe --writes/--no-writes --ablate`: what each head writes is on every card by
default, the ablation only when asked, and a bad --ablate is refused in one line before any pass."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from headscope.cli import app

runner = CliRunner()
SMALL = ("--context", 32, "--windows", 2, "--resamples", 0)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_cards_say_what_each_head_writes_by_default(toy_dir, toy_texts):
    result = invoke("describe", toy_dir, "--eval-text", toy_texts, *SMALL)
    assert result.exit_code == 0, result.output
    assert result.output.count("writes: copies") == 8
    assert "ablating it" not in result.output
    result = invoke("describe", toy_dir, "--eval-text", toy_texts, *SMALL, "--no-writes")
    assert result.exit_code == 0, result.output
    assert "writes: copies" not in result.output


def test_ablate_a_count_from_python(toy, toy_texts):
    import headscope as hs

    atlas = hs.describe(toy, eval_text=toy_texts, context=32, windows=2, resamples=0, ablate=2).atlas
    ablated = [h for h in atlas.heads if "matters" in h]
    assert len(ablated) == 2 and atlas.ablation["heads"] == 2
    # The two heads with the least attention on the first token.
    lowest = sorted(atlas.heads, key=lambda h: (h["first_token"], h["layer"], h["head"]))[:2]
    assert {(h["layer"], h["head"]) for h in ablated} == {(h["layer"], h["head"]) for h in lowest}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("L5H0", "has no head L5H0"),
        ("9", "--ablate 9: model has 8 heads"),
        ("x", "--ablate x: 'x' is not a head"),
    ],
)
def test_a_bad_ablate_is_one_line_before_any_pass(toy_dir, value, message):
    result = invoke("describe", toy_dir, "--context", 32, "--ablate", value)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
