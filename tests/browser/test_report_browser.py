"""The HTML report in a real browser: headless Chromium (Debian's package) driven by Playwright (slow).

The report is built from a real SmolLM2 scan (the attention-pattern detectors) with its attention
heatmaps. Without Chromium, or without the playwright package, these tests fail and say what to
install: they never skip silently.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headscope.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()
CJK = re.compile(r"[\u4e00-\u9fff]")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "the browser tests need Chromium: apt-get install chromium fonts-noto-cjk (make test does it as root)"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    html, table = folder / "report.html", folder / "scan.csv"
    result = runner.invoke(
        app,
        [
            "scan", "smollm2-135m", "--detectors", "previous-token,duplicate-token,induction,sink",
            "--resamples", "200", "--html", str(html), "--csv", str(table),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return html, list(csv.DictReader(io.StringIO(table.read_text())))


@pytest.fixture(scope="module")
def page(built):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the browser tests need the playwright package: pip install playwright (in the dev extra)"
        )
    html, _ = built
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("request", lambda request: requests.append(request.url))
        tab.goto(html.resolve().as_uri())
        tab.wait_for_selector("[data-testid=cell]")
        yield tab, errors, requests
        browser.close()


def _data(tab) -> dict:
    return json.loads(tab.locator("script#headscope-data").text_content())


def test_loads_offline_without_errors(page, built):
    tab, errors, requests = page
    html, _ = built
    assert errors == []
    assert set(requests) == {html.resolve().as_uri()}
    assert html.stat().st_size <= 5_000_000


def test_grid_has_a_cell_per_head(page):
    tab, _, _ = page
    assert tab.locator("[data-testid=cell]").count() == 30 * 9


def test_clicking_a_head_shows_its_scores(page, built):
    tab, errors, _ = page
    _, rows = built
    table = next(t for t in _data(tab)["tables"] if t["detector"] == "induction")
    tab.locator("[data-testid=cell][data-layer='18'][data-head='6']").click()
    shown = tab.locator(f"#panel [data-testid=panel-score][data-table='{table['id']}']").first.text_content()
    csv_score = next(
        float(r["score"])
        for r in rows
        if r["detector"] == "induction" and r["layer"] == "18" and r["head"] == "6"
    )
    assert shown.strip() == f"{csv_score:.3f}"
    assert tab.locator("#panel [data-testid=heatmap]").count() == 3
    assert errors == []


def test_arrow_keys_move_the_focus(page):
    tab, _, _ = page
    tab.locator("[data-testid=cell][data-layer='0'][data-head='0']").focus()
    tab.keyboard.press("ArrowRight")
    assert tab.evaluate("document.activeElement.dataset.head") == "1"
    tab.keyboard.press("ArrowDown")
    assert tab.evaluate("[document.activeElement.dataset.layer, document.activeElement.dataset.head]") == [
        "1",
        "1",
    ]
    tab.keyboard.press("Enter")
    assert "L1" in tab.locator("#panel").text_content()


def test_sorting_by_score_orders_the_rows(page):
    tab, _, _ = page
    table = next(t for t in _data(tab)["tables"] if t["detector"] == "induction")
    selector = f"table[data-table='{table['id']}']"
    section = tab.locator(selector)
    section.scroll_into_view_if_needed()
    tab.evaluate(f"document.querySelector(\"{selector}\").closest('details')?.setAttribute('open', '')")
    header = section.locator("th[data-sort=score]")
    header.click()
    first = [float(v) for v in section.locator("td[data-col=score]").all_text_contents()]
    header.click()
    second = [float(v) for v in section.locator("td[data-col=score]").all_text_contents()]
    assert len(first) == 270
    assert {tuple(first), tuple(second)} == {tuple(sorted(first)), tuple(sorted(first, reverse=True))}


def test_chinese_tokens_are_in_the_page(page):
    tab, _, _ = page
    tab.locator("[data-testid=cell][data-layer='2'][data-head='1']").click()
    assert CJK.search(tab.locator("#panel").inner_text())


def test_screenshot_is_not_blank(page, tmp_path):
    from matplotlib import image

    tab, _, _ = page
    pixels = image.imread(io.BytesIO(tab.screenshot(full_page=False)), format="png")
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::97].tolist()}
    assert len(colours) > 20 and Path(tmp_path).exists()
