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
from attnaudit.target import load_target

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
    browser.set_window_size(1280, browser.execute_script(
        "return document.body.scrollHeight;"))
    assert browser.save_screenshot(str(tmp_path / "report-date.png"))
