"""A report opened in Debian's headless Chromium (driven by Playwright), as a person would see it.

`.ci/run` installs the `chromium` package (`make browser` does the same on a workstation);
without it the browser tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

CHROMIUM = "/usr/bin/chromium"
# No first-run or background traffic: it would count as the page's own requests.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def require_chromium() -> str:
    """Chromium's path; skips the test without it (fails under CI)."""
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
    pytest.skip("Debian's chromium is not installed (make browser)")


def check_report(report: str | os.PathLike, screenshot: str | os.PathLike,
                 plots: set[str], names: list[str], examples: int,
                 baselines: list[str]) -> str:
    """Opens an evaluation report in Chromium, waits for it to load, takes a full-page
    screenshot and checks what a reader sees: no console errors, no requests for anything
    but the report file itself and inline `data:` URIs, and what the arguments say.

    Args:
        report: The report.html file.
        screenshot: Where the full-page PNG goes.
        plots: Ids of the `figure.plot` elements that must be there (and no others).
        names: Class or label names (from the data, not the report's generator): each
            must be written on the page.
        examples: The evaluated split's size (from the data): the summary must show it.
        baselines: Names of the baselines the table beside the model must list, in order.

    Returns:
        The page's visible text.
    """
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    url = pathlib.Path(report).resolve().as_uri()
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url)
                    if r.url != url and not r.url.startswith("data:") else None)
            page.goto(url, wait_until="load")
            page.screenshot(path=str(screenshot), full_page=True)
            assert errors == [], errors
            assert requests == [], requests
            figures = page.query_selector_all("figure.plot")
            assert {f.get_attribute("id") for f in figures} == plots
            for figure in figures:  # every plot drew something of its own size
                box = figure.query_selector("svg").bounding_box()
                assert box["width"] > 200 and box["height"] > 150, figure.get_attribute("id")
            assert page.query_selector("#mistakes") is not None
            summary = dict(row.inner_text().split("\t") for row in
                           page.query_selector_all("table.summary tr"))
            assert int(next(v for k, v in summary.items()
                            if k in ("examples", "texts"))) == examples
            rows = page.query_selector_all("table#baselines tr")
            assert [row.inner_text().split("\t")[0] for row in rows[1:]] == [
                "this model", *baselines]
            text = page.inner_text("body")
            for name in names:
                assert name in text, name
            assert "script" not in page.content().lower().replace("<noscript", "")
        finally:
            browser.close()
    assert os.path.getsize(screenshot) > 20_000
    return text
