"""The sweep plot draws each analysis' own panels from the analysis (icl's ICL score lives beside
icl, in icl_present), not from a branch of outputs/views."""

from __future__ import annotations

import inspect

import pandas as pd

from headscope.outputs import views

# One run's rows at one step only: no role table changes across steps, so only the ICL panel is drawn.
TABLE = pd.DataFrame(
    [
        {
            "series": "run",
            "step": 100,
            "analysis": "icl",
            "data": "",
            "detector": "induction",
            "relation": "",
            "direction": "",
            "layer": 0,
            "head": 0,
        }
    ]
)


def test_the_icl_panel_is_drawn_by_icl(tmp_path, monkeypatch):
    from headscope.analyses import icl_present

    drawn = []
    panels = icl_present.sweep_panels

    def spy(losses):
        found = panels(losses)
        return [lambda ax, draw=draw: (drawn.append(ax.get_title()), draw(ax)) for draw in found]

    monkeypatch.setattr(icl_present, "sweep_panels", spy)
    losses = pd.DataFrame(
        {
            "series": ["run", "run"],
            "step": [100, 200],
            "icl_score": [-0.1, -0.4],
            "icl_score_low": [-0.2, -0.5],
            "icl_score_high": [0.0, -0.3],
            "first": [None, None],  # no repeated-copy loss (an icl sweep measures none)
            "later": [None, None],
        }
    )
    path = tmp_path / "sweep.png"
    views.save_sweep_png(TABLE, losses, path)
    assert path.read_bytes().startswith(b"\x89PNG") and len(drawn) == 1
    assert "icl" not in inspect.getsource(views).lower()  # the outputs know no analysis' panel


def test_no_icl_score_no_icl_panel():
    from headscope.analyses.icl_present import sweep_panels

    assert sweep_panels(pd.DataFrame({"series": ["run"], "step": [1], "first": [1.0], "later": [0.5]})) == []
