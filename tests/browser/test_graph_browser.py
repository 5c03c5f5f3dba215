"""graph's page in a real browser (headless Chromium driven by Playwright; slow): the report's shell
with the head graph on it. Built from the trained toy (a few seconds): a head's card, its sources
lit to a depth, the URL's #L1H0, and the filters' edge count, checked against the result itself."""

from __future__ import annotations

import shutil

import pytest
from conftest import TOY_DIR

import headscope as hs
from headscope.analyses.graph_page import write_graph_html

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    result = hs.graph(str(TOY_DIR), repeat_seq=2, seq_len=20, windows=5, rows=0, resamples=200)
    path = tmp_path_factory.mktemp("graph") / "graph.html"
    write_graph_html(result, path, False)
    return path, result.graph


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the browser tests need the playwright package: pip install playwright (in the dev extra)"
        )
    path = next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
    )
    if path is None:
        pytest.fail("the browser tests need Chromium: apt-get install chromium (make browser)")
    with sync_playwright() as driver:
        found = driver.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield found
        found.close()


@pytest.fixture
def tab(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: requests.append(request.url))
    page.requests = requests  # type: ignore[attr-defined]
    yield page
    assert errors == []  # no console errors, in any test
    page.close()


def _open(tab, built, hash_: str = "") -> None:
    tab.goto(built[0].resolve().as_uri() + hash_)
    tab.wait_for_selector("[data-testid=graph-node]")


def _node(tab, name: str):
    return tab.locator(f"[data-testid=graph-node][data-node='{name}']")


def _shown(tab) -> int:
    return int(tab.locator("[data-testid=graph-edge-count]").get_attribute("data-shown"))


def _into(found, name: str) -> list[dict]:
    return [e for e in found.edges if f"L{e['layer']}H{e['head']}" == name]


def test_the_page_is_offline_and_draws_every_head_and_edge(tab, built):
    _open(tab, built)
    assert set(tab.requests) == {built[0].resolve().as_uri()}
    found = built[1]
    assert tab.locator("[data-testid=graph-edge]").count() == len(found.edges)
    assert _shown(tab) == len(found.edges)
    for entry in found.heads:
        assert _node(tab, f"L{entry['layer']}H{entry['head']}").count() == 1
    assert _node(tab, "embed").count() == 1 and _node(tab, "mlp0").count() == 1


def test_a_click_shows_the_heads_card_and_lights_its_sources(tab, built):
    _open(tab, built)
    card = tab.locator("[data-testid=graph-card]")
    _node(tab, "L1H1").hover()  # hovering shows a head's card while the pointer is on it
    assert card.get_attribute("data-node") == "L1H1"
    tab.mouse.move(0, 0)
    assert card.get_attribute("data-node") is None
    _node(tab, "L1H0").click()
    tab.mouse.move(0, 0)  # off the node: the card stays on the clicked head
    assert card.get_attribute("data-node") == "L1H0"
    assert "L1H0" in card.locator("[data-testid=graph-card-title]").text_content()
    wanted = _into(built[1], "L1H0")
    assert wanted
    rows = card.locator("[data-testid=graph-card-source].edge")
    shown = {(r.get_attribute("data-side"), r.get_attribute("data-source")) for r in rows.all()}
    assert shown == {(e["side"], e["source"]) for e in wanted}
    for edge in wanted:
        row = card.locator(
            f"[data-testid=graph-card-source][data-side='{edge['side']}'][data-source='{edge['source']}']"
        )
        assert f"{edge['share']:.3f}" in row.text_content()
        assert f"[{edge['ci_low']:.3f}, {edge['ci_high']:.3f}]" in row.text_content()
    lit = tab.locator("[data-testid=graph-edge].lit")
    assert {(e.get_attribute("data-side"), e.get_attribute("data-source")) for e in lit.all()} == {
        (e["side"], e["source"]) for e in wanted
    }
    assert tab.evaluate("location.hash") == "#L1H0"


def test_ancestors_to_depth_two_light_the_sources_sources(tab, built):
    _open(tab, built, "#L1H0")
    found = built[1]
    first = _into(found, "L1H0")
    sources = {e["source"] for e in first}
    second = [e for s in sources for e in _into(found, s)]
    assert second  # L0's heads read the embedding
    tab.locator("[data-testid=graph-depth]").fill("2")
    assert tab.locator("[data-testid=graph-edge].lit").count() == len(first) + len(second)


def test_a_hash_opens_that_head(tab, built):
    _open(tab, built, "#L1H0")
    assert "selected" in _node(tab, "L1H0").get_attribute("class")
    assert tab.locator("[data-testid=graph-card]").get_attribute("data-node") == "L1H0"
    # the graph is in view, though the report's own panel (below it) opened for the head too
    assert abs(tab.evaluate("document.getElementById('graph').getBoundingClientRect().top")) < 2
    tab.evaluate("location.hash = '#L1H2'")
    tab.wait_for_function("document.querySelector('[data-testid=graph-card]').dataset.node === 'L1H2'")
    assert "selected" in _node(tab, "L1H2").get_attribute("class")


def test_the_filters_change_the_edges_shown(tab, built):
    _open(tab, built)
    found = built[1]
    total = len(found.edges)
    assert _shown(tab) == total
    slider = tab.locator("[data-testid=graph-threshold]")
    assert float(slider.get_attribute("min")) == found.threshold
    slider.evaluate("(s) => { s.value = '0.5'; s.dispatchEvent(new Event('input', { bubbles: true })); }")
    above = sum(1 for e in found.edges if e["share"] >= 0.5)
    assert _shown(tab) == above < total
    drawn = tab.locator("[data-testid=graph-edge]").evaluate_all(
        "(edges) => edges.filter((e) => getComputedStyle(e).display !== 'none').length"
    )
    assert drawn == above  # (a vertical edge has no width, so Playwright's :visible would miss it)
    slider.evaluate("(s) => { s.value = s.min; s.dispatchEvent(new Event('input', { bubbles: true })); }")
    assert _shown(tab) == total
    tab.locator("[data-testid=graph-side-value]").uncheck()
    assert _shown(tab) == sum(1 for e in found.edges if e["side"] != "value")
    tab.locator("[data-testid=graph-side-value]").check()
    roles = {(h["layer"], h["head"]): h["role"] or "(no role)" for h in found.heads}
    role = next(r for r in sorted(set(roles.values())) if r != "(no role)")
    tab.locator("[data-testid=graph-role]").select_option(role)
    assert _shown(tab) == sum(1 for e in found.edges if roles[(e["layer"], e["head"])] == role)
