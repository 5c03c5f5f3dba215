"""The HTML report renderer: one offline document, data embedded safely, schema checked."""

from __future__ import annotations

import base64
import copy
import json
import math
import re

import pytest

from headscope.outputs.html import check_data, render

LAYERS, HEADS, KV = 3, 4, 2


def _map(n: int, seed: int) -> str:
    values = bytes(((i * 7 + seed * 13) % 256) if i % n <= i // n else 0 for i in range(n * n))
    return base64.b64encode(values).decode("ascii")


def make_data() -> dict:
    roles = [
        {"label": "ind", "meaning": "induction", "color": "#1f77b4"},
        {"label": "prev", "meaning": "previous token", "color": "#ff7f0e"},
        {"label": "sink", "meaning": "rests on the first token", "color": "#cccccc"},
    ]
    role_of = {(0, 0): "prev", (1, 2): "ind", (2, 1): "ind", (2, 3): ""}
    heads = []
    rows = []
    for layer in range(LAYERS):
        for head in range(HEADS):
            role = role_of.get((layer, head), "sink")
            score = 0.1 * (layer + 1) + 0.01 * head
            heads.append(
                {
                    "layer": layer,
                    "head": head,
                    "kv_group": head // (HEADS // KV),
                    "role": role,
                    "secondary": ["dup"] if (layer, head) == (1, 2) else [],
                    "score": score,
                    "ci_low": score - 0.05,
                    "ci_high": score + 0.05,
                    "baseline": 0.05,
                    "table": "induction",
                }
            )
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "kv_group": head // (HEADS // KV),
                    "score": None if (layer, head) == (2, 3) else score,
                    "baseline": 0.05,
                    "ci_low": score - 0.05,
                    "ci_high": score + 0.05,
                    "n": 40,
                    "rank": layer * HEADS + head + 1,
                    "role": role if role != "sink" else "",
                }
            )
    tokens = ["The", " cat", "</script><b>x</b>", "猫", "在", "睡觉", "\n", ""]
    return {
        "schema": "headscope-report/1",
        "title": "headscope scan · toy",
        "model": {
            "name": "toy",
            "layers": LAYERS,
            "heads": HEADS,
            "kv_heads": KV,
            "group_size": HEADS // KV,
            "head_dim": 16,
            "d_model": 64,
            "local_layers": [0, 1],
            "global_layers": [2],
            "window": 4,
            "causal": True,
        },
        "headscope": "0.1.0",
        "command": "headscope scan toy --html out.html",
        "created": "2025-01-01T00:00:00Z",
        "datasets": [{"data": "repeat", "description": "repeated random tokens"}],
        "roles": roles,
        "heads": heads,
        "tables": [
            {
                "id": "induction",
                "title": "Induction",
                "data": "repeat",
                "detector": "induction",
                "relation": "",
                "direction": "",
                "summary": "attention to the token after the earlier copy",
                "baseline": 0.05,
                "signed": False,
                "rows": rows,
            },
            {
                "id": "dla",
                "title": "Direct logit attribution",
                "data": "ioi",
                "detector": "dla",
                "relation": "",
                "direction": "",
                "summary": "",
                "baseline": None,
                "signed": True,
                "rows": [dict(r, score=(r["score"] or 0) - 0.2, baseline=None) for r in rows[:5]],
            },
        ],
        "summaries": [
            {
                "title": "verify",
                "columns": ["head", "ok", "p"],
                "rows": [["L1H2", True, 0.001], ["L2H1", None, 3]],
            }
        ],
        "notes": ["a note with </script><script>alert(1)</script> inside", "<!-- not a comment -->"],
        "examples": [
            {
                "name": "zh",
                "tokens": tokens,
                "maps": {"1,2": _map(len(tokens), 1), "0,0": _map(len(tokens), 2)},
            },
            {"name": "empty", "tokens": [], "maps": {}},
        ],
    }


def embedded_json(page: str) -> str:
    match = re.search(r'<script id="headscope-data" type="application/json">(.*?)</script>', page, re.S)
    assert match, "no data script"
    return match.group(1)


def test_one_document_offline():
    page = render(make_data())
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<html") == 1 and page.count("</html>") == 1
    assert page.count("<body") == 1 and page.count("</body>") == 1
    assert '<meta charset="utf-8">' in page
    assert "http" not in page.lower()
    assert "<link" not in page and "@import" not in page and " src=" not in page
    assert page.count("<style>") == 1
    # the data script plus the page script, nothing else
    assert len(re.findall(r"<script\b", page)) == 2
    assert "Noto Sans CJK SC" in page
    assert 'id="panel"' in page or '"panel"' in page  # the panel is built by the script


def test_script_tags_cannot_be_closed_by_data():
    data = make_data()
    page = render(data)
    raw = embedded_json(page)
    assert "<" not in raw and ">" not in raw
    # exactly two closing script tags: the data one and the code one
    assert page.lower().count("</script") == 2
    assert "</script><b>" not in page


def test_data_round_trips():
    data = make_data()
    back = json.loads(embedded_json(render(data)))
    assert back == data
    assert back["examples"][0]["tokens"][3] == "猫"
    # non-ASCII is kept as text, not \\u escapes
    assert "睡觉" in embedded_json(render(data))


def test_nan_and_infinity_become_null():
    data = make_data()
    data["heads"][0]["score"] = math.nan
    data["tables"][0]["rows"][1]["ci_high"] = math.inf
    back = json.loads(embedded_json(render(data)))
    assert back["heads"][0]["score"] is None
    assert back["tables"][0]["rows"][1]["ci_high"] is None
    raw = embedded_json(render(data))
    assert "NaN" not in raw and "Infinity" not in raw
    assert math.isnan(data["heads"][0]["score"])  # the input is not changed


def test_urls_in_data_are_not_references():
    data = make_data()
    data["notes"].append("see https://example.org and HTTP://x")
    page = render(data)
    assert "://" not in page.replace("\\u003a//", "")
    assert json.loads(embedded_json(page))["notes"][-1] == "see https://example.org and HTTP://x"


def test_title_is_escaped():
    data = make_data()
    data["title"] = "a <b> & </title>"
    page = render(data)
    assert "<title>a &lt;b&gt; &amp; &lt;/title&gt;</title>" in page


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("heads"), "data: missing key 'heads'"),
        (lambda d: d["model"].pop("kv_heads"), "data['model']: missing key 'kv_heads'"),
        (lambda d: d["heads"][2].pop("role"), "data['heads'][2]: missing key 'role'"),
        (lambda d: d["tables"][1]["rows"][0].pop("rank"), "data['tables'][1]['rows'][0]: missing key 'rank'"),
        (lambda d: d["examples"][0].pop("maps"), "data['examples'][0]: missing key 'maps'"),
        (lambda d: d["heads"][0].update(layer="0"), "data['heads'][0]['layer']: expected int, got str"),
        (lambda d: d["heads"][0].update(score="high"), "data['heads'][0]['score']: expected number or null"),
        (lambda d: d["tables"][0].update(signed=1), "data['tables'][0]['signed']: expected bool, got int"),
        (lambda d: d["model"].update(causal=None), "data['model']['causal']: expected bool, got null"),
        (lambda d: d["roles"][0].update(color="blue"), "data['roles'][0]['color']: expected '#rrggbb'"),
        (lambda d: d.update(schema="other/2"), "data['schema']: expected 'headscope-report/1'"),
        (lambda d: d["examples"][0]["maps"].update({"L1H2": "AA=="}), "is not 'layer,head'"),
        (lambda d: d["examples"][0].update(tokens=["a"] * 65), "at most 64 tokens, got 65"),
        (lambda d: d["notes"].append(3), "data['notes'][2]: expected str, got int"),
    ],
)
def test_check_data_rejects(mutate, message):
    data = copy.deepcopy(make_data())
    mutate(data)
    with pytest.raises(ValueError) as err:
        check_data(data)
    assert message in str(err.value)
    with pytest.raises(ValueError):
        render(data)


def test_check_data_accepts_minimal_and_non_dict():
    check_data(make_data())
    minimal = make_data()
    for key in ("heads", "tables", "summaries", "notes", "examples", "datasets", "roles"):
        minimal[key] = []
    minimal["model"]["local_layers"] = []
    minimal["model"]["window"] = None
    page = render(minimal)
    assert json.loads(embedded_json(page))["heads"] == []
    with pytest.raises(ValueError, match="expected an object, got list"):
        check_data([])


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [("heads", "layer", LAYERS), ("heads", "head", -1), ("tables", "head", HEADS)],
)
def test_check_data_refuses_a_head_outside_the_model(where, key, value):
    data = make_data()
    target = data["heads"][5] if where == "heads" else data["tables"][0]["rows"][2]
    target[key] = value
    with pytest.raises(ValueError, match=f"outside the model's .* {key}s, got {value}"):
        check_data(data)


def test_check_data_wants_the_role_map_to_be_the_models_grid():
    """The role map is drawn from ``heads``: more (or fewer) cells than the layout is refused."""
    data = make_data()
    data["heads"] = data["heads"][:-1]
    with pytest.raises(ValueError, match=r"expected 3 x 4 heads \(the model's layout\), got 11"):
        check_data(data)


# --- an analysis' own section: scan's describe cards in the head panel ----------------------------------

_ATLAS_HEAD = {
    "layer": 1,
    "head": 0,
    "kv_group": 0,
    "explained": {"value": 0.93, "ci_low": 0.92, "ci_high": 0.94},
    "explained_off_first": {"value": 0.9, "ci_low": 0.89, "ci_high": 0.91},
    "first_token": 0.05,
    "left": 0.07,
    "components": [{"template": "local-4", "name": "local-4", "weight": 1.0, "query_class": "all"}],
    "dominant": "local-4",
    "roles": [],
    "contexts": [
        {
            "window": "natural<en>#1",
            "off_first": 0.96,
            "arrows": [
                {
                    "query": 2,
                    "key": 1,
                    "weight": 0.4,
                    "query_token": "cat",
                    "key_token": "The",
                    "before": "",
                    "between": "",
                }
            ],
        }
    ],
}


class _ScanResult:
    """What Scan.html_section reads: a live atlas in ``state``, else the atlas of the result's JSON."""

    def __init__(self, atlas: dict | None) -> None:
        self.state: dict = {}
        self._atlas = atlas

    def to_dict(self) -> dict:
        return {"atlas": self._atlas}


def test_scan_puts_each_heads_describe_card_into_the_report():
    from headscope.extend.protocol import get

    section = get("scan").html_section(_ScanResult({"heads": [_ATLAS_HEAD]}))
    page = render(make_data(), [section])
    head, body = page.split("<body>", 1)
    assert ".head-card .card" in head and "<style>" not in body  # the section's CSS joins the stylesheet
    cards = re.findall(r'<template data-head-card="(\d+),(\d+)">(.*?)</template>', body, flags=re.S)
    assert [(layer, h) for layer, h, _ in cards] == [("1", "0")]
    card = cards[0][2]
    # the description, the share it explains and leaves, the top contexts (escaped)
    assert "<span class=sb-l>explained</span>" in card and "0.930" in card and "leaves 0.07" in card
    assert "natural&lt;en&gt;#1" in card and "natural<en>" not in page
    assert 'id="head-cards" hidden' in body
    # the head panel shows the card of the head it opens
    assert "template[data-head-card=" in page and 'data-testid": "panel-card"' in page
    embedded_json(page)  # the page data is unchanged in form


def test_scan_without_an_atlas_adds_no_section():
    from headscope.extend.protocol import get

    assert get("scan").html_section(_ScanResult(None)) is None
    assert render(make_data(), []) == render(make_data())


def test_a_saved_atlas_entry_that_does_not_fit_gets_no_card_and_the_page_says_so():
    from headscope.extend.protocol import get

    broken = {**_ATLAS_HEAD, "head": 1, "explained": None}
    section = get("scan").html_section(_ScanResult({"heads": [_ATLAS_HEAD, broken, "x"]}))
    page = render(make_data(), [section])
    assert re.findall(r'<template data-head-card="(\d+,\d+)">', page) == ["1,0"]
    note = re.search(r'<p class="notes" data-testid="head-cards-unfit">(.*?)</p>', page).group(1)
    assert "2 of the saved atlas' head entries" in note and "heads[1]" in note and "heads[2]" in note
