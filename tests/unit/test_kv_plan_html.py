"""The kv-plan section of the HTML report: a KV-head grid and a table per sparsity, drawn from ``kv_plan``."""

from __future__ import annotations

import copy
import json
import re

import pytest

from headscope.analyses import kvplan_present
from headscope.outputs import html, report_data


def _evaluation(accuracy: float, answer_loss: float, text_loss: float) -> dict:
    return {"accuracy": accuracy, "answer_loss": answer_loss, "text_loss": text_loss}


def _head(layer: int, kv: int, candidate: bool, mass: float, retrieval: float) -> dict:
    return {
        "layer": layer,
        "kv_head": kv,
        "query_heads": [2 * kv, 2 * kv + 1],
        "candidate": candidate,
        "mass": mass,
        "mass_low": mass - 0.01,
        "mass_high": mass + 0.01,
        "mass_needles": mass,
        "mass_text": mass,
        "retrieval": retrieval,
        "retrieval_low": retrieval,
        "retrieval_high": retrieval,
        "ablation": None,
        "ablation_low": None,
        "ablation_high": None,
        "rank_score": (mass + retrieval) / 2,
    }


def _sparsity(sparsity: float, streaming: list[list[int]], plan: dict, mean: dict) -> dict:
    return {
        "sparsity": sparsity,
        "n_streaming": len(streaming),
        "streaming": streaming,
        "plan": plan,
        "random": [{"streaming": streaming, **mean}],
        "random_mean": mean,
        "random_exhaustive": False,
        "memory": [
            {
                "context": 300,
                "full_bytes": 307200,
                "plan_bytes": 235520,
                "saved_share": 0.2333,
                "reduction": 1.3043,
            },
            {
                "context": 2048,
                "full_bytes": 2097152,
                "plan_bytes": 1577984,
                "saved_share": 0.2476,
                "reduction": 1.329,
            },
        ],
    }


def _row(layer: int, head: int, detector: str, score: float) -> dict:
    return {
        "model": "toy",
        "detector": detector,
        "relation": "",
        "direction": "",
        "data": "needles",
        "layer": layer,
        "head": head,
        "kv_group": head // 2,
        "score": score,
        "baseline": 0.5,
        "ci_low": score - 0.01,
        "ci_high": score + 0.01,
        "n": 100,
        "rank": 1,
        "role": "",
    }


def make_saved(with_plan: bool = True) -> dict:
    """A kv-plan result as ``result.to_dict()`` saves it: 2 layers x 2 KV heads, layer 1's KV head 1 a window head."""
    saved = {
        "schema": "headscope-result/1",
        "headscope": "0.0.0",
        "command": "kv-plan",
        "model": "toy",
        "sections": [
            {
                "detector": "long-range",
                "relation": "",
                "direction": "",
                "data": "needles",
                "description": "needles",
            }
        ],
        "rows": [
            _row(layer, head, "long-range", 0.1 * (layer + head)) for layer in range(2) for head in range(4)
        ],
        "notes": [],
        "layout": {"layers": 2, "heads": 4, "kv_heads": 2, "group_size": 2, "head_dim": 8, "d_model": 32},
        "outcomes": {},
    }
    if with_plan:
        saved["kv_plan"] = {
            "kind": "kv-plan",
            "model": "toy",
            "method": "mass",
            "sink": 4,
            "recent": 16,
            "contexts": [300],
            "kv_dtype": "float32",
            "layers": 2,
            "kv_heads": 2,
            "candidates": [[0, 0], [0, 1], [1, 0]],
            "prompts": 24,
            "text_chunks": 3,
            "heads": [
                _head(0, 0, True, 0.8, 0.5),
                _head(0, 1, True, 0.01, 0.0),
                _head(1, 0, True, 0.3, 0.25),
                _head(1, 1, False, 0.02, 0.0),
            ],
            "full": _evaluation(1.0, 0.001, 13.9),
            "sparsities": [
                _sparsity(0.25, [[0, 1]], _evaluation(0.875, 0.01, 13.95), _evaluation(0.333, 7.02, 14.0)),
                _sparsity(
                    0.75, [[0, 1], [1, 0]], _evaluation(0.625, 1.5, 14.2), _evaluation(0.125, 8.7, 14.5)
                ),
            ],
            "agreement": None,
            "notes": ["only <global> layers are candidates; see https://example.org"],
        }
    return saved


def page_of(saved: dict) -> tuple[dict, str]:
    """The report data and the page, with kv-plan's own section (KVPlanAnalysis.html_section)."""
    built = report_data.build(saved, layout=saved.get("layout"), examples=[], command="hs.kv_plan()")
    section = kvplan_present.section_html(saved)
    return built, html.render(built, [section] if section else [])


def _figures(page: str) -> list[str]:
    return re.findall(r'<figure class="kv-sparsity".*?</figure>', page, flags=re.S)


def _decisions(figure: str) -> dict[tuple[int, int], str]:
    cells = re.findall(r'data-decision="(\w+)" data-layer="(\d+)" data-kv-head="(\d+)"', figure)
    return {(int(layer), int(kv)): decision for decision, layer, kv in cells}


def test_kv_plan_reaches_the_report_data():
    plan = kvplan_present.plan_data(make_saved())
    assert plan["layers"] == 2 and plan["kv_heads"] == 2 and plan["candidates"] == 3
    assert [s["sparsity"] for s in plan["sparsities"]] == [0.25, 0.75]
    assert plan["sparsities"][1]["streaming"] == [[0, 1], [1, 0]]
    json.dumps(plan, allow_nan=False)


def test_grid_colours_each_kv_head_by_its_decision():
    _, page = page_of(make_saved())
    assert page.count('<section id="kv-plan"') == 1
    figures = _figures(page)
    assert len(figures) == 2
    first, second = (_decisions(f) for f in figures)
    assert first == {(0, 0): "full", (0, 1): "streaming", (1, 0): "full", (1, 1): "window"}
    assert second == {(0, 0): "full", (0, 1): "streaming", (1, 0): "streaming", (1, 1): "window"}
    counts = [
        {d: list(cells.values()).count(d) for d in ("full", "streaming", "window")}
        for cells in (first, second)
    ]
    assert counts == [{"full": 2, "streaming": 1, "window": 1}, {"full": 1, "streaming": 2, "window": 1}]
    # the class names colour the cells; every cell says what it is in its title
    assert figures[1].count('class="kv-cell kv-streaming"') == 2
    title = re.search(r'data-layer="0" data-kv-head="0" title="([^"]*)"', figures[0]).group(1)
    assert "layer 0" in title and "KV head 0" in title and "full" in title
    assert "long-range mass 0.800" in title and "retrieval 0.500" in title


def test_tables_show_accuracy_loss_and_memory():
    _, page = page_of(make_saved())
    tables = [
        re.search(r'<table class="plain kv-table".*?</table>', f, flags=re.S).group(0) for f in _figures(page)
    ]
    assert len(tables) == 2

    def row(table: str, metric: str) -> list[str]:
        found = re.search(rf'<tr data-metric="{metric}"[^>]*>(.*?)</tr>', table, flags=re.S).group(1)
        return re.findall(r"<td[^>]*>(.*?)</td>", found)[1:]

    assert row(tables[0], "streaming") == ["1 of 3"]
    assert row(tables[0], "accuracy") == ["0.875", "0.333"]
    assert row(tables[1], "accuracy") == ["0.625", "0.125"]
    assert row(tables[1], "answer_loss") == ["1.500", "8.700"]
    assert row(tables[0], "text_loss") == ["+0.050", "+0.100"]
    memory = re.findall(r'data-context="(\d+)"><td>[^<]*</td><td[^>]*>([^<]*)</td>', tables[0])
    assert memory == [("300", "23% (1.30\u00d7)"), ("2048", "25% (1.33\u00d7)")]


def test_header_legend_and_notes_are_escaped():
    _, page = page_of(make_saved())
    section = re.search(r'<section id="kv-plan".*?</section>', page, flags=re.S).group(0)
    facts = re.search(r'<p class="kv-facts"[^>]*>(.*?)</p>', section, flags=re.S).group(1)
    for part in ("toy", "mass", "sink 4 + recent 16", "context 300", "3 of 4 KV heads are candidates"):
        assert part in facts
    assert "&lt;global&gt;" in section and "<global>" not in page
    assert "https:" not in page.lower()  # still no network reference, even as text
    assert "https&#58;//example.org" in section
    legend = re.search(r'<div class="legend kv-legend".*?</div>', section, flags=re.S).group(0)
    assert all(f"swatch kv-{name}" in legend for name in ("full", "streaming", "window"))


def test_a_report_without_kv_plan_has_no_kv_section():
    built, page = page_of(make_saved(with_plan=False))
    assert "kv_plan" not in built
    assert kvplan_present.section_html(make_saved(with_plan=False)) is None
    assert 'id="kv-plan"' not in page and "kv-cell" not in page and kvplan_present._KV_CSS not in page


def test_a_kv_plan_does_not_change_the_rest_of_the_page():
    with_plan, _ = page_of(make_saved())
    without, _ = page_of(make_saved(with_plan=False))
    with_plan.pop("created"), without.pop("created")
    assert with_plan == without


def test_check_data_refuses_a_bad_kv_plan():
    plan = kvplan_present.plan_data(make_saved())
    bad = copy.deepcopy(plan)
    bad["heads"][0]["layer"] = 5
    with pytest.raises(ValueError, match="kv_plan"):
        kvplan_present.check_plan_data(bad)
    bad = copy.deepcopy(plan)
    bad["sparsities"][0]["streaming"] = [[0]]
    with pytest.raises(ValueError, match="streaming"):
        kvplan_present.check_plan_data(bad)


def test_the_section_css_joins_the_page_stylesheet():
    _, page = page_of(make_saved())
    head, body = page.split("<body>", 1)
    assert kvplan_present._KV_CSS in head and "<style>" not in body
