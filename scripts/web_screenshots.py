"""Screenshots of `memplan serve` and of a report for the README (docs/web-*.png).

Run: PYTHONPATH=src python scripts/web_screenshots.py   (needs playwright and Debian's chromium)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from memplan.api import Machine, estimate_from_names, load_recipe
from memplan.report.html import render_report
from memplan.web.thread import serving

DOCS = Path(__file__).resolve().parents[1] / "docs"
PLAN = ("model=meta-llama/Llama-3.1-70B&node=DGX-H100&gpus=64&zero=3&checkpointing=full"
        "&seq_len=4096&micro_batch=2")


def main() -> None:
    with serving() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/?{PLAN}")
        page.wait_for_selector('b[data-k="max_micro_batch"]:not([data-pending])')
        page.screenshot(path=DOCS / "web-page.png", full_page=True)
        page.click('button[data-action="pin"]')
        page.wait_for_selector('table[data-compare="2"]')
        page.select_option('select[name="checkpointing"]', "selective")
        page.wait_for_url("**checkpointing=selective**")
        page.wait_for_selector('b[data-k="max_micro_batch"]:not([data-pending])')
        page.locator("#results").screenshot(path=DOCS / "web-compare.png")
        d = estimate_from_names("meta-llama/Llama-3.2-1B", load_recipe(None, {
            "micro_batch": 8, "seq_len": 4096}), Machine(gpu="A100-80GB")).to_dict()
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "report.html"
            out.write_text(render_report(d))
            page.goto(out.as_uri())
            page.screenshot(path=DOCS / "web-report.png", full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
