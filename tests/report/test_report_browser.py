"""The report of a real (small) run in a real browser: Debian's chromium driven by Playwright
(no browser download). Skips when either is missing here; fails in CI, where `.ci/run`
installs both.

Set BERTSCOPE_SCREENSHOT_DIR to also write the README's screenshot (report.png) there.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_view_browser import browser  # noqa: F401  (the shared chromium fixture)

from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")

CORPUS = ["The cat sat on the mat.\tIt purred loudly, twice.", "A dog barked at the mailman.",
          "Rain fell on the quiet town all night, and the river rose."] * 4


def open_page(chromium):
    """A new page and the list its console errors, page errors and network requests go to."""
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"network request: {r.url}") if not r.url.startswith(("file:", "data:"))
            else None)
    return page, errors


def test_report_of_a_real_run(browser, tiny_checkpoint, tmp_path):  # noqa: F811
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--limit", "all",
                 "--out", str(out), "--quiet"]) == 0
    report = out / "index.html"
    assert report.is_file()

    page, errors = open_page(browser)
    page.goto(report.resolve().as_uri())
    widths = page.eval_on_selector_all("img", "els => els.map(e => e.complete ? e.naturalWidth : 0)")
    assert len(widths) == 5 and all(w > 0 for w in widths), widths  # the five surface figures, all decoded
    assert page.locator("section#surface ul.findings li").count() >= 6
    surface = page.inner_text("section#surface")
    assert "previous-token heads" in surface and "broad heads (mean entropy above 90% of uniform" in surface
    assert errors == []
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    shots = os.environ.get("BERTSCOPE_SCREENSHOT_DIR")
    if shots:
        page.screenshot(path=str(Path(shots) / "report.png"), clip={"x": 0, "y": 0, "width": 1200, "height": 900})
    page.close()


def test_report_gathers_the_analyses_of_one_run_directory(browser, tiny_checkpoint, wiki, tmp_path):  # noqa: F811
    """Pattern types and dataset cues added to one run directory: the refreshed report shows both
    sections, every figure decodes, nothing is fetched and nothing is logged as an error."""
    from conftest import require_data

    require_data("arct")
    out = tmp_path / "run"
    assert main(["patterns", "--model", str(tiny_checkpoint), "--data", "wiki", "--limit", "8", "--batch-size", "4",
                 "--out", str(out), "--quiet", "--threads", "1"]) == 0
    assert main(["cues", "--task", "arct", "--out", str(out), "--quiet"]) == 0
    page, errors = open_page(browser)
    page.goto((out / "index.html").resolve().as_uri())
    for name in ("patterns", "cues"):
        assert page.locator(f"section#{name}").count() == 1, name
    assert "Heterogeneous" in page.inner_text("section#patterns")
    assert "report 0.61 and 0.64" in page.inner_text("section#cues")
    widths = page.eval_on_selector_all("img", "els => els.map(e => e.complete ? e.naturalWidth : 0)")
    assert len(widths) >= 4 and all(w > 0 for w in widths), widths  # patterns' figures and cues.png
    assert errors == []
    page.close()
