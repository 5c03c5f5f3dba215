"""Open a describe page (``headscope describe MODEL --html PAGE``) in headless Chromium as a new
user would, with one head's card open, and save a screenshot; print the page's size, how long it
took to become interactive, and any console error (the docs' gallery runs this).

    python scripts/atlas_screenshot.py PAGE.html OUT.png [--head L18H6]

Needs Chromium and the playwright package (``make browser``). Exits 1 on a console error.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--head", default="L0H0", help="the head whose card is open (the URL hash)")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
    )
    if chromium is None:
        print("atlas_screenshot: Chromium not found (make browser installs it)", file=sys.stderr)
        return 2
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": args.width, "height": args.height})
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("request", lambda r: requests.append(r.url))
        started = time.perf_counter()
        tab.goto(args.page.resolve().as_uri() + f"#{args.head}")
        tab.wait_for_selector("#panel [data-testid=card]")
        opened = time.perf_counter() - started
        interactive = tab.evaluate("performance.getEntriesByType('navigation')[0].domInteractive")
        cells = tab.locator("[data-testid=cell]").count()
        tab.screenshot(path=str(args.out))
        browser.close()
    outside = [r for r in requests if not r.startswith("file:") and not r.startswith("data:")]
    print(
        f"{args.page.name}: {args.page.stat().st_size / 1e6:.2f} MB, {cells} heads; interactive after "
        f"{interactive / 1000:.2f} s, {args.head}'s card open after {opened:.2f} s; "
        f"{len(outside)} requests outside the file; {len(errors)} console errors"
    )
    for error in errors:
        print(f"console error: {error}", file=sys.stderr)
    return 1 if errors or outside else 0


if __name__ == "__main__":
    sys.exit(main())
