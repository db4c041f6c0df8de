"""The viewer page in a real browser: Debian's chromium, driven by Playwright (no browser
download). Skips when either is missing here; fails in CI, where `.ci/run` installs both.

Set BERTSCOPE_SCREENSHOT_DIR to also write the README's screenshots (view_grid.png,
view_head.png) there.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import bertscope
from bertscope.view import SCALE, render, view_data

pytestmark = pytest.mark.usefixtures("single_thread")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
TEXT, PAIR = "The cat sat on the mat, unbelievably.", "It purred."


def missing(reason: str):
    if os.environ.get("CI"):  # in CI a missing browser is a broken install step, not a reason to test less
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file() and not shutil.which("chromium"):
        missing(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium"),
                                     args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def scope(minilm_path):
    return bertscope.load(minilm_path)


def write_page(scope, folder: Path, text: str, pair: str | None = None) -> tuple[Path, dict]:
    data = view_data(scope, text, pair)
    path = folder / "view.html"
    path.write_text(render(data), encoding="utf-8")  # what write_view writes, from the same data
    return path, data


@pytest.fixture(scope="module")
def page_file(tmp_path_factory, scope):
    return write_page(scope, tmp_path_factory.mktemp("view"), TEXT, PAIR)


def open_page(browser, path: Path, errors: list):
    page = browser.new_page(viewport={"width": 1300, "height": 860})
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri())
    return page


def label_index(page, selector: str) -> list[int]:
    return page.eval_on_selector_all(selector, "els => els.map(e => +e.dataset.i)")


def test_click_a_head_hover_a_token(browser, page_file, tmp_path):
    path, data = page_file
    n_tokens, n_words = len(data["tokens"]), len(data["words"])
    assert n_words < n_tokens  # "unbelievably" and "purred" are split
    errors = []
    page = open_page(browser, path, errors)

    # the grid: one small word-level map per head
    assert page.locator(".head").count() == 6 * 12
    assert page.eval_on_selector("#head-2-5 canvas", "c => [c.width, c.height]") == [n_words, n_words]
    assert "H 0.02" in page.inner_text("#head-1-3")  # MiniLM's previous-token head: entropy near 0
    shots = os.environ.get("BERTSCOPE_SCREENSHOT_DIR")
    if shots:
        page.screenshot(path=str(Path(shots) / "view_grid.png"), clip={"x": 0, "y": 0, "width": 1300, "height": 560})

    # click a head: the large map, one labelled row per word
    page.click("#head-1-3")
    assert page.is_visible("#detail")
    assert page.locator("#rows .lab").count() == n_words and page.locator("#cols .lab").count() == n_words
    assert page.inner_text("#rows .lab >> nth=0") == "[CLS]"
    size = page.eval_on_selector("#big", "c => [c.width, c.height]")
    assert size[0] == size[1] and size[0] % n_words == 0
    assert "not computed yet" in page.inner_text("#pattern-row")

    # token level: one row per token
    page.check("#detail input[value=token]")
    assert page.locator("#rows .lab").count() == n_tokens
    assert page.is_checked("header input[value=token]")  # both switches in step
    assert page.eval_on_selector("#head-2-5 canvas", "c => c.width") == n_tokens

    # hover a token: what it attends to (keys) and what attends to it (queries)
    m = np.asarray(data["token_maps"][0][2]).reshape(n_tokens, n_tokens) / SCALE
    i = data["tokens"].index("mat")
    page.hover(f"#rows .lab >> nth={i}")
    assert label_index(page, "#cols .lab.top") == [int(m[i].argmax())] == [data["tokens"].index("the", 2)]
    assert label_index(page, "#rows .lab.top") == [int(m[:, i].argmax())]
    assert label_index(page, "#rows .lab.focus") == [i] == label_index(page, "#cols .lab.focus")
    assert label_index(page, "#cols .lab.to") == [int(j) for j in np.flatnonzero(m[i] > 0)]
    top = page.eval_on_selector("#cols .lab.top", "e => getComputedStyle(e).backgroundColor")
    assert top == "rgb(203, 24, 29)"  # the strongest key at full strength
    assert "\u201cmat\u201d attends most to \u201cthe\u201d" in page.inner_text("#d-info")
    page.screenshot(path=str(tmp_path / "view.png"))
    assert (tmp_path / "view.png").stat().st_size > 10_000
    if shots:
        page.check("#detail input[value=word]")
        page.hover("#rows .lab >> nth=5")
        page.screenshot(path=str(Path(shots) / "view_head.png"), clip={"x": 0, "y": 0, "width": 960, "height": 600})

    page.evaluate("document.activeElement.blur()")  # arrow keys on a focused radio switch the level instead
    page.keyboard.press("ArrowRight")  # the next head, same level
    assert page.inner_text("#d-title").startswith("head 1-4") and page.locator("#rows .lab").count() == n_tokens
    page.keyboard.press("Escape")
    assert not page.is_visible("#detail")
    assert errors == []
    page.close()


def test_words_of_one_token_share_the_token_maps(browser, scope, tmp_path):
    path, data = write_page(scope, tmp_path, "The cat sat on the mat.")
    assert data["word_maps"] is None  # the page falls back to the token maps at word level
    errors = []
    page = open_page(browser, path, errors)
    page.click("#head-2-9")
    assert page.locator("#rows .lab").count() == 9 and page.inner_text("#rows .lab >> nth=1") == "The"
    page.check("#detail input[value=token]")
    assert page.inner_text("#rows .lab >> nth=1") == "the"
    page.hover("#rows .lab >> nth=1")
    m = np.asarray(data["token_maps"][1][8]).reshape(9, 9)
    assert label_index(page, "#cols .lab.top") == [int(m[1].argmax())]
    assert errors == []
    page.close()
