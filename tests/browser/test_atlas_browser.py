"""describe's page in a real browser (headless Chromium driven by Playwright; slow): the report's
shell painted by the atlas. Built from the trained toy (a few seconds), not a bundled model: the
page's behaviour does not depend on the model's size, and SmolLM2's page is measured in the docs.
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from headscope.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory, toy_dir, toy_texts):
    folder = tmp_path_factory.mktemp("atlas")
    html, out = folder / "atlas.html", folder / "atlas.json"
    result = runner.invoke(
        app,
        [
            "describe", str(toy_dir), "--eval-text", str(toy_texts), "--context", "96", "--windows", "8",
            "--resamples", "200", "--html", str(html), "--format", "json", "-o", str(out),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return html, json.loads(out.read_text())["atlas"]


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
def tab(browser, built):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: requests.append(request.url))
    page.errors, page.requests = errors, requests  # type: ignore[attr-defined]
    yield page
    assert errors == []  # no console errors, in any test
    page.close()


def _open(tab, built, hash_: str = "") -> None:
    tab.goto(built[0].resolve().as_uri() + hash_)
    tab.wait_for_selector("[data-testid=cell]")


def _cell(tab, layer: int, head: int):
    return tab.locator(f"[data-testid=cell][data-layer='{layer}'][data-head='{head}']")


def test_the_page_is_offline_and_interactive_fast(tab, built):
    _open(tab, built)
    assert set(tab.requests) == {built[0].resolve().as_uri()}
    interactive = tab.evaluate("performance.getEntriesByType('navigation')[0].domInteractive")
    assert interactive < 2000
    assert tab.locator("[data-testid=cell]").count() == 2 * 4


def test_a_click_opens_the_heads_card_and_names_it_in_the_hash(tab, built):
    _open(tab, built)
    _cell(tab, 1, 2).click()
    card = tab.locator("#panel [data-testid=card]")
    assert card.get_attribute("id") == "L1H2"
    assert tab.evaluate("location.hash") == "#L1H2"
    head = next(h for h in built[1]["heads"] if (h["layer"], h["head"]) == (1, 2))
    assert head["dominant"] in card.locator("h3").text_content()


def test_a_hash_opens_that_head(tab, built):
    _open(tab, built, "#L0H3")
    assert tab.locator("#panel [data-testid=card]").get_attribute("id") == "L0H3"
    # The arrow keys move the open panel from head to head.
    tab.keyboard.press("ArrowDown")
    assert tab.locator("#panel [data-testid=card]").get_attribute("id") == "L1H3"


def test_the_two_heatmaps_of_a_card_have_the_same_shape(tab, built):
    _open(tab, built, "#L1H1")
    images = tab.locator("#panel [data-testid=card-heatmap]")
    assert images.count() == 2
    sizes = images.evaluate_all(
        "xs => xs.map(x => [x.naturalWidth, x.naturalHeight, x.getBoundingClientRect().width, "
        "x.getBoundingClientRect().height])"
    )
    assert sizes[0] == sizes[1]
    tokens = len(built[1]["excerpts"][0]["tokens"])
    assert sizes[0][:2] == [tokens, tokens - 1]


def test_filters_dim_exactly_the_heads_they_leave_out(tab, built):
    _open(tab, built)
    shares = {(h["layer"], h["head"]): h["explained"]["value"] for h in built[1]["heads"]}
    cut = sorted(shares.values())[len(shares) // 2]
    tab.locator("[data-testid=grid-filter-min]").fill(f"{cut:.4f}")

    def dimmed():
        found = tab.locator("[data-testid=cell][data-dimmed=true]").evaluate_all(
            "xs => xs.map(x => [Number(x.dataset.layer), Number(x.dataset.head)])"
        )
        return {tuple(x) for x in found}

    assert dimmed() == {k for k, v in shares.items() if v < cut - 1e-4}
    tab.locator("[data-testid=grid-filter-min]").fill("0")
    tab.locator("[data-testid=grid-filter-search]").fill("L1H2")
    assert dimmed() == set(shares) - {(1, 2)}
    tab.locator("[data-testid=grid-filter-search]").fill("")
    kind = built[1]["heads"][0]["dominant_kind"]
    tab.locator("[data-testid=grid-filter-kind]").select_option(kind)
    assert dimmed() == {(h["layer"], h["head"]) for h in built[1]["heads"] if h["dominant_kind"] != kind}


def test_the_tooltip_gives_the_description_and_share(tab, built):
    _open(tab, built)
    _cell(tab, 0, 1).hover()
    text = tab.locator("[data-testid=tooltip]").text_content()
    assert text.startswith("L0H1 · ") and "explained" in text


def test_a_role_keeps_its_badge_until_the_legend_hides_it(tab, built):
    _open(tab, built)
    with_role = [h for h in built[1]["heads"] if any(r != "sink" for r in h["roles"])]
    assert with_role  # 8 windows with intervals: the toy's previous-token heads have their role
    head = with_role[0]
    role = next(r for r in head["roles"] if r != "sink")
    cell = _cell(tab, head["layer"], head["head"])
    assert "role-badge" in cell.get_attribute("class") and cell.text_content() == role
    tab.locator(f"[data-testid=legend] input[data-role='{role}']").uncheck()
    assert "role-badge" not in cell.get_attribute("class")
    assert cell.text_content().startswith("~")  # its dominant template instead
    # The role filter keeps exactly the heads with that role.
    tab.locator("[data-testid=grid-filter-role]").select_option(role)
    kept = tab.locator("[data-testid=cell][data-dimmed=false]").evaluate_all(
        "xs => xs.map(x => [Number(x.dataset.layer), Number(x.dataset.head)])"
    )
    assert sorted(map(tuple, kept)) == sorted(
        (h["layer"], h["head"]) for h in with_role if role in h["roles"]
    )


@pytest.fixture(scope="module")
def two(built):
    """The page of two describe results (``report a.json b.json --html``): the toy beside itself."""
    saved = built[0].parent / "atlas.json"
    page = built[0].parent / "two.html"
    result = runner.invoke(
        app, ["report", str(saved), str(saved), "--html", str(page)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return page


def _beside(tab, side: str, layer: int, head: int):
    return tab.locator(
        f"[data-testid=beside-cell][data-side={side}][data-layer='{layer}'][data-head='{head}']"
    )


def test_the_second_models_grid_opens_its_heads_and_names_them_in_the_hash(tab, two, built):
    tab.goto(two.resolve().as_uri())
    tab.wait_for_selector("[data-testid=beside-cell]")
    _beside(tab, "b", 1, 2).click()
    panel = tab.locator("#panel")
    assert panel.get_attribute("data-side") == "b" and tab.evaluate("location.hash") == "#b-L1H2"
    assert "L1 H2" in tab.locator("[data-testid=panel-title]").text_content()
    # Its own card (held once in the page, filled in on opening), beside its closest head here.
    assert panel.locator("[data-testid=card]").get_attribute("id") == "L1H2"
    nearest = panel.locator("[data-testid=nearest]")
    assert nearest.get_attribute("data-nearest").startswith("L1H")  # the same atlas: itself
    assert "selected" in _beside(tab, "b", 1, 2).get_attribute("class")
    # Its link opens the first model's head, with that head's card and its partner's.
    name = nearest.get_attribute("data-nearest")
    nearest.locator("a").click()
    tab.wait_for_function("document.getElementById('panel').dataset.side === 'a'")
    assert tab.evaluate("location.hash") == f"#{name}"
    assert panel.locator("[data-testid=card]").first.get_attribute("id") == name
    # Back to the second model from the partner's link.
    panel.locator("[data-testid=partner] a").click()
    tab.wait_for_function("document.getElementById('panel').dataset.side === 'b'")
    assert tab.evaluate("location.hash").startswith("#b-")


def test_a_hash_opens_a_head_of_the_second_model_and_the_keyboard_reaches_its_grid(tab, two):
    tab.goto(two.resolve().as_uri() + "#b-L0H3")
    tab.wait_for_selector("[data-testid=beside-cell]")
    panel = tab.locator("#panel")
    assert not panel.is_hidden() and panel.get_attribute("data-side") == "b"
    assert panel.locator("[data-testid=card]").get_attribute("id") == "L0H3"
    tab.keyboard.press("Escape")
    assert panel.is_hidden() and tab.evaluate("location.hash") == ""
    _beside(tab, "a", 0, 1).focus()
    tab.keyboard.press("Enter")
    assert panel.get_attribute("data-side") == "a" and tab.evaluate("location.hash") == "#L0H1"
    tab.keyboard.press("Escape")  # focus is still on the drawn cell
    assert panel.is_hidden()
