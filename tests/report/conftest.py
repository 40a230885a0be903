"""Headless Chromium for the report's browser tests: Debian's ``chromium`` and
``chromium-driver`` (installed by ``.ci/run``) through selenium. A test that asks for
``browser`` is skipped, with the reason, only where they are not installed; where they are
and selenium is not, it fails rather than skip (selenium is a dev dependency)."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Debian chromium and chromium-driver are not installed "
                    "(apt-get install chromium chromium-driver; .ci/run does this)")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER),
                              options=options)
    loaded = driver.get

    def get(url: str) -> None:  # the page, and every explorer on it started (a busy machine)
        from selenium.webdriver.support.ui import WebDriverWait

        loaded(url)
        WebDriverWait(driver, READY_SECONDS).until(lambda d: d.execute_script(READY))

    driver.get = get
    yield driver
    driver.quit()


READY_SECONDS = 60
# loaded, and every explorer drawn (its canvas is made when its script starts)
READY = """return document.readyState === 'complete' && Array.from(
    document.querySelectorAll('.ax-explorer')).every(e => e.querySelector('canvas'));"""
