"""The page and the report in a real browser: Playwright driving Debian's chromium.

The server runs in a thread on port 0. Every request the browser makes is checked: anything
that leaves 127.0.0.1 (or file:// for the report) is aborted and fails the test. Skipped with
a reason where chromium or playwright is missing (CI installs both: see .ci/run).
"""

import os
import re
import shutil
from urllib.parse import parse_qs, urlsplit

import pytest

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
pytest.importorskip("uvicorn")
CHROMIUM = os.environ.get("MEMPLAN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"no chromium binary at {CHROMIUM} (apt-get install -y chromium)",
                allow_module_level=True)

from memplan.web.thread import serving  # noqa: E402

pytestmark = pytest.mark.slow
ARGS = ["--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def base_url():
    with serving() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    outside: list[str] = []

    def guard(route):
        u = urlsplit(route.request.url)
        if u.scheme == "file" or (u.scheme in ("http", "https") and u.hostname == "127.0.0.1"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.route("**/*", guard)
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    context.close()
    assert outside == [], f"requests left 127.0.0.1: {outside}"


def _peak(pg):
    return pg.locator('#results > .result [data-k="peak_allocated"]').first.inner_text()


def _wait_change(pg, before, selector='#results > .result [data-k="peak_allocated"]'):
    pg.wait_for_function("([sel, before]) => { const e = document.querySelector(sel); "
                         "return e && e.innerText !== before; }", arg=[selector, before])


def test_controls_update_numbers_and_url(page, base_url):
    page.goto(f"{base_url}/?model=meta-llama/Llama-3.2-1B")
    before = _peak(page)
    page.fill('input[name="micro_batch"]', "6")
    _wait_change(page, before)
    page.wait_for_url(re.compile(r"micro_batch=6"))
    after = _peak(page)
    assert after != before
    # a select and a checkbox update too
    page.select_option('select[name="checkpointing"]', "full")
    _wait_change(page, after)
    page.wait_for_url(re.compile(r"checkpointing=full"))
    q = parse_qs(urlsplit(page.url).query)
    assert q["micro_batch"] == ["6"] and q["checkpointing"] == ["full"]
    # the shared URL opens the same plan
    shown = _peak(page)
    page.goto(page.url)
    assert _peak(page) == shown
    assert page.input_value('input[name="micro_batch"]') == "6"
    # the largest micro-batch arrives in its own request
    page.wait_for_selector('#results > .result b[data-k="max_micro_batch"]:not([data-pending])')
    from memplan.api import estimate_from_names, load_recipe

    want = estimate_from_names("meta-llama/Llama-3.2-1B", load_recipe(None, {
        "micro_batch": 6, "checkpointing": "full"})).max_micro_batch
    assert page.locator('#results > .result b[data-k="max_micro_batch"]').inner_text() == str(want)


def test_compare_two_recipes(page, base_url):
    page.goto(f"{base_url}/?model=meta-llama/Llama-3.2-1B&micro_batch=2")
    page.click('button[data-action="pin"]')
    page.wait_for_selector('table[data-compare="2"]')
    before = page.locator('td[data-col="0"][data-k="peak_allocated"]').inner_text()
    page.fill('input[name="micro_batch"]', "8")
    _wait_change(page, before, 'td[data-col="0"][data-k="peak_allocated"]')
    cur = page.locator('td[data-col="0"][data-k="peak_allocated"]').inner_text()
    pinned = page.locator('td[data-col="1"][data-k="peak_allocated"]').inner_text()
    assert cur != pinned and pinned == before
    page.wait_for_url(re.compile(r"pin="))
    assert "micro_batch=8" in page.url
    assert page.locator("svg[data-chart=category-bars] g[data-legend]").count() == 2


def test_bad_input_shows_the_message_in_the_page(page, base_url):
    page.goto(f"{base_url}/?model=meta-llama/Llama-3.2-1B")
    page.fill('input[name="gpu"]', "H1000")
    page.wait_for_selector('#results [data-error="1"]')
    assert "H1000" in page.locator('#results [data-error="1"]').inner_text()
    page.fill('input[name="gpu"]', "A100-80GB")
    page.wait_for_selector('#results > .result [data-k="peak_allocated"]')


def test_report_opens_from_file(page, tmp_path):
    from memplan.api import Machine, estimate_from_names, load_recipe
    from memplan.report.html import render_report

    d = estimate_from_names("meta-llama/Llama-3.2-1B", load_recipe(),
                            Machine(gpu="A100-80GB")).to_dict()
    out = tmp_path / "report.html"
    out.write_text(render_report(d))
    page.goto(out.as_uri())
    assert "Llama-3.2-1B" in page.title()
    box = page.locator("svg[data-chart=timeline]").bounding_box()
    assert box and box["width"] > 300 and box["height"] > 100
    peak = page.locator("svg[data-chart=timeline] g[data-peak]")
    assert int(peak.get_attribute("data-bytes")) == d["gpu"]["peak_allocated_bytes"]
