"""The report in headless Chromium: no console errors, every image loads, every section.

Uses Debian's ``chromium`` and ``chromium-driver`` (installed by ``.ci/run``) through
selenium; skipped, with the reason, only where they are not installed. selenium is a dev
dependency: where the browser is installed and selenium is not, the test fails rather than
skip. The full-page screenshot goes to pytest's temporary directory, outside the checkout.
"""

from __future__ import annotations

import shutil

import pytest

import attnaudit
from attnaudit.checklist import ITEM_KEYS, STATUSES
from attnaudit.targets.loading import load_target

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian chromium and chromium-driver are not installed "
           "(apt-get install chromium chromium-driver; .ci/run does this)")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER),
                              options=options)
    yield driver
    driver.quit()


def test_report_renders_in_chromium(browser, tmp_path):
    from selenium.webdriver.common.by import By

    index = attnaudit.audit(load_target(None), quick=True, limit=8, progress=False).save(tmp_path)
    browser.get(index.as_uri())
    sections = browser.find_elements(By.CSS_SELECTOR, "section.checklist-item")
    assert [s.get_attribute("data-item") for s in sections] == list(ITEM_KEYS)
    assert all(s.get_attribute("data-status") in STATUSES for s in sections)
    assert all(s.is_displayed() for s in sections)
    images = browser.find_elements(By.TAG_NAME, "img")
    assert images
    widths = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth]);")
    assert all(complete and width > 0 for complete, width in widths), widths
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    # every table sits in a box, and no box clips: wider content scrolls inside its box
    boxes = browser.execute_script("""
        return Array.from(document.querySelectorAll('table')).map(t => {
          const box = t.parentElement;
          return {wrapped: box.classList.contains('table-wrap'), scroll: box.scrollWidth,
                  client: box.clientWidth, overflow: getComputedStyle(box).overflowX,
                  csv: t.dataset.csv || ''};
        });""")
    assert len(boxes) >= 20 and all(b["wrapped"] for b in boxes), boxes
    clipped = [b for b in boxes
               if b["scroll"] > b["client"] and b["overflow"] not in ("auto", "scroll")]
    assert clipped == []
    assert any(b["scroll"] > b["client"] for b in boxes)  # the performance table is wide
    page_width = browser.execute_script("return document.documentElement.clientWidth;")
    assert browser.execute_script("return document.documentElement.scrollWidth;") <= page_width
    # the metric definitions are in the page, as its appendix
    appendix = browser.find_element(By.ID, "definitions")
    assert appendix.find_element(By.TAG_NAME, "h2").text == "Appendix: metric definitions"
    headings = [h.text for h in appendix.find_elements(By.TAG_NAME, "h3")]
    assert "Attribution and agreement" in headings and len(headings) >= 4
    assert "Jain & Wallace band" in appendix.text
    browser.set_window_size(1280, browser.execute_script(
        "return document.body.scrollHeight;"))
    assert browser.save_screenshot(str(tmp_path / "report-date.png"))
