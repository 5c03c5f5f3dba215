"""``graph --html`` (issue 56): the head graph as a page of the report. The page holds every head and
every edge of a real (toy) result, fetches nothing, escapes what it embeds, is written atomically, and
stays small for a 30-layer model (the browser behaviour is in tests/browser/test_graph_browser.py)."""

from __future__ import annotations

import json
import random
import re

import pytest
from conftest import TOY_DIR

import headscope as hs
from headscope.analyses.graph import SIDES, GraphResult, edges_of
from headscope.analyses.graph_page import SHOWN, section, write_graph_html
from headscope.errors import InputError, OutputError


@pytest.fixture(scope="module")
def toy_result():
    return hs.graph(str(TOY_DIR), repeat_seq=2, seq_len=20, windows=5, rows=0, resamples=200)


@pytest.fixture(scope="module")
def toy_page(toy_result, tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "graph.html"
    said = write_graph_html(toy_result, path, False)
    assert said.startswith(str(path))
    return path.read_text(encoding="utf-8")


def embedded(page: str) -> dict:
    match = re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', page, re.S)
    assert match, "no graph data"
    return json.loads(match.group(1))


def test_the_page_is_the_reports_shell_with_the_graph_on_it(toy_page):
    assert toy_page.startswith("<!DOCTYPE html>") and toy_page.count("</html>") == 1
    assert '<header id="header">' in toy_page and '<main id="main">' in toy_page
    assert 'id="headscope-data"' in toy_page  # the report's own data and script drew the frame
    assert toy_page.count('<section id="graph"') == 1
    # the graph's stylesheet joined the page's one <style>
    assert toy_page.count("<style>") == 1 and ".graph-card" in toy_page


def test_the_page_holds_every_head_and_every_edge(toy_result, toy_page):
    found = toy_result.graph
    data = embedded(toy_page)
    assert len(found.heads) == 8 and found.edges
    assert [(h["layer"], h["head"], h["role"]) for h in data["heads"]] == [
        (h["layer"], h["head"], h["role"]) for h in found.heads
    ]
    assert (data["layers"], data["heads_per_layer"]) == (2, 4)
    drawn = {
        (
            data["heads"][row[0]]["layer"],
            data["heads"][row[0]]["head"],
            data["sides"][row[1]],
            data["names"][row[2]],
            row[3],
        )
        for row in data["edges"]
    }
    wanted = {(e["layer"], e["head"], e["side"], e["source"], round(e["share"], 4)) for e in found.edges}
    assert drawn == wanted and len(data["edges"]) == len(found.edges)
    # Each head's card lists its strongest sources per side, with their intervals.
    for entry, shown in zip(found.heads, data["heads"], strict=True):
        for side in SIDES:
            best = max(entry[side], key=lambda item: item["share"])
            first = shown["sources"][side][0]
            assert data["names"][first[0]] == best["source"]
            assert first[1:] == [round(best[k], 4) for k in ("share", "ci_low", "ci_high")]


def test_the_page_fetches_nothing(toy_page):
    assert re.search(r"(?i)https?:", toy_page) is None
    for reference in ("<link", "@import", "url(", " src=", "fetch(", "XMLHttpRequest", "import("):
        assert reference not in toy_page
    # the page's scripts: the report's data and script, the graph's data and script
    assert len(re.findall(r"<script\b", toy_page)) == 4


def test_what_the_page_embeds_is_escaped():
    bad = "</script><script>alert('x')</script>"
    role = '<img src=x onerror="alert(1)">'
    heads = [
        {"layer": 0, "head": 0, "kv_group": 0, "role": role, "margin": 1.0, "windows": 3,
         "query": [], "key": [], "value": []},
        {"layer": 1, "head": 0, "kv_group": 0, "role": "", "margin": 1.0, "windows": 3,
         "query": [{"source": "L0H0", "kind": "head", "role": role, "share": 0.5, "ci_low": 0.4, "ci_high": 0.6}],
         "key": [{"source": bad, "kind": "x", "role": "", "share": 0.5, "ci_low": 0.4, "ci_high": 0.6}],
         "value": []},
    ]  # fmt: skip
    found = GraphResult(
        heads, edges_of(heads, 0.1, "margin"), f"{bad} & https://example.org", "margin", 0.1, {}, {}
    )
    page = section(found, "<b>model</b>")
    assert bad not in page and "<img" not in page and "<b>model" not in page
    assert re.search(r"(?i)https?:", page) is None
    assert "&lt;/script&gt;&lt;script&gt;" in page  # the data description, as text
    data = embedded(page)
    assert data["data"] == f"{bad} & https://example.org" and data["model"] == "<b>model</b>"
    assert data["heads"][0]["role"] == role and bad in data["names"]


def test_the_writer_is_atomic_and_refuses_to_overwrite(toy_result, tmp_path):
    path = tmp_path / "graph.html"
    path.write_text("kept")
    with pytest.raises(OutputError, match="--html"):
        write_graph_html(toy_result, path, False)
    assert path.read_text() == "kept"
    write_graph_html(toy_result, path, True)
    assert 'id="graph-data"' in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.html"]  # no temporary file left


def test_a_result_without_a_graph_is_refused(tmp_path):
    class NoGraph:
        graph = None

    with pytest.raises(InputError, match="no graph"):
        write_graph_html(NoGraph(), tmp_path / "g.html", False)
    assert not (tmp_path / "g.html").exists()


def synthetic(layers: int = 30, per_layer: int = 9, n_edges: int = 2000, seed: int = 0) -> GraphResult:
    """A 30 x 9 model's graph: every head with every source below it on each side (as graph measures
    them), and ``n_edges`` edges."""
    rng = random.Random(seed)
    roles = ["induction", "previous-token", "duplicate-token", "sink", ""]
    heads = []
    for layer in range(layers):
        below = ["embed"] + [f"L{j}H{m}" for j in range(layer) for m in range(per_layer)]
        below += [f"mlp{j}" for j in range(layer)] + ["bias"]
        for head in range(per_layer):
            entry = {"layer": layer, "head": head, "kv_group": head // 3, "role": rng.choice(roles),
                     "margin": rng.uniform(0, 9), "output": rng.uniform(0, 1), "unresolved": None,
                     "value_unresolved": None, "windows": 40}  # fmt: skip
            for side in SIDES:
                entry[side] = []
                for source in below:
                    share = rng.uniform(-0.02, 0.05)
                    entry[side].append({"source": source, "kind": "head", "role": "", "share": share,
                                        "ci_low": share - 0.01, "ci_high": share + 0.01})  # fmt: skip
            heads.append(entry)
    planted: set[tuple[int, str, int]] = set()
    while len(planted) < n_edges:
        index, side = rng.randrange(per_layer, len(heads)), rng.choice(SIDES)
        which = rng.randrange(len(heads[index][side]))
        planted.add((index, side, which))
        item = heads[index][side][which]
        item["share"] = rng.uniform(0.1, 0.9)
        item["ci_low"], item["ci_high"] = item["share"] - 0.05, item["share"] + 0.05
    edges = edges_of(heads, 0.1, "margin")
    return GraphResult(heads, edges, "repeated random tokens", "margin", 0.1, {"fit": 40, "eval": 40}, {})


def test_a_30_layer_graph_with_2000_edges_is_a_small_page():
    found = synthetic()
    assert len(found.heads) == 270 and len(found.edges) == 2000
    page = section(found, "synthetic")
    size = len(page.encode("utf-8"))
    assert size < 1_500_000, f"{size / 1e6:.2f} MB"
    data = embedded(page)
    assert len(data["edges"]) == len(found.edges)
    # Each card keeps its edges and the strongest few, not every source below the head.
    top = data["heads"][-1]
    n_edges = {
        side: sum(1 for e in found.edges if (e["layer"], e["head"], e["side"]) == (29, 8, side))
        for side in SIDES
    }
    for side in SIDES:
        assert len(top["sources"][side]) <= SHOWN + n_edges[side] < len(found.heads[-1][side])
