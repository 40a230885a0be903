"""The explorer of a long-prompt decoder-only report (a tiny GPT-2 continuing a 4,096-token
prompt) in headless Chromium, read against its CSVs: the first view is the continuation
over the prompt in blocks, on the head whose rows' largest weights are the largest;
hovered block means equal ``attention_maps.csv``; zoomed into a
block, a kept key reads its exact weight from ``attention_top_keys.csv`` and any other key
the block mean, marked as such; back out, the blocks again. No network request, no console
error. Full-page screenshots at 1400 and 420 pixels wide go to ``$ATTNAUDIT_SCREENSHOTS``
when it is set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.long_prompt import long_prompt_report
from tests.report.test_explorer_browser import (
    open_page,
    point_at,
    press,
    readout,
    requests,
    select,
    severe,
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return long_prompt_report(tmp_path_factory)


def cell(browser, q: int, k: int) -> dict[str, str]:
    """Hover the head view's cell (query q, key k of the drawn window); the readout."""
    hit = browser.execute_script("return window.attnauditExplorers[0].scene.hits[0];")
    return point_at(browser, hit["x"] + (k - hit["k0"] + 0.5) * hit["cw"],
                    hit["y"] + (q - hit["q0"] + 0.5) * hit["ch"])


def screenshot(browser, name: str, width: int) -> None:
    folder = os.environ.get("ATTNAUDIT_SCREENSHOTS")
    if not folder:
        return
    browser.set_window_size(width, 1200)
    height = browser.execute_script("return document.documentElement.scrollHeight;")
    browser.set_window_size(width, height)
    Path(folder).mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(Path(folder) / f"{name}-{width}.png"))


def test_the_long_prompt_explorer_zooms_into_a_block_with_exact_kept_keys(browser, report):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    maps, tops = report.maps, report.tops
    means = maps[(maps["view"] == "cross") & (maps["measure"] == "weights")].set_index(
        ["layer", "head", "query", "key"])["value"]
    open_page(browser, report.index)
    browser.set_window_size(1400, 1400)
    first = readout(browser)
    assert first["view"] == "cross" and first["kind"] == "block mean"
    layer, head = int(first["layer"]), int(first["head"])
    # it opens on the head whose rows' largest weights (their exact top keys) are the largest
    largest = tops[(tops["view"] == "cross") & (tops["kind"] == "top") & (tops["rank"] == 0)]
    assert largest.groupby(["layer", "head"])["value"].mean().idxmax() == (layer, head)
    legend = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-legend").text
    assert "4096 tokens in blocks of 32" in legend
    # the overview: hovered block means are the CSV's
    for q, block in ((0, 0), (3, 77), (5, 127)):
        got = cell(browser, q, block)
        assert (got["layer"], got["head"], got["query"], got["key"], got["kind"]) == (
            str(layer), str(head), str(q), str(block), "block mean")
        assert float(got["exact"]) == means[layer, head, q, block]
    screenshot(browser, "long-prompt-overview", 1400)

    # zoom into the block of step 2's largest key
    step = 2
    kept = tops[(tops["view"] == "cross") & (tops["layer"] == layer) & (tops["head"] == head)
                & (tops["query"] == step)]
    best = kept[(kept["kind"] == "top") & (kept["rank"] == 0)].iloc[0]
    block = int(best["block"])
    browser.set_window_size(1400, 1400)
    select(browser, "ax-zoom", block)
    got = cell(browser, step, int(best["key"]) - 32 * block)
    assert (got["key"], got["block"], got["kind"]) == (str(best["key"]), str(block),
                                                       "exact, a kept key")
    assert float(got["exact"]) == best["value"]
    in_block = set(kept[kept["block"] == block]["key"].astype(int))
    other = next(k for k in range(32 * block, 32 * block + 32) if k not in in_block)
    got = cell(browser, step, other - 32 * block)
    assert got["key"] == str(other) and got["kind"].startswith("block mean of keys")
    assert float(got["exact"]) == means[layer, head, step, block]
    legend = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-legend").text
    assert f"Zoomed into block {block}" in legend
    screenshot(browser, "long-prompt-zoomed", 1400)
    screenshot(browser, "long-prompt-zoomed", 420)

    # key 0 is kept in block 0, and the model view shows the zoomed block too
    browser.set_window_size(1400, 1400)
    select(browser, "ax-zoom", 0)
    got = cell(browser, 4, 0)
    first_weight = tops[(tops["view"] == "cross") & (tops["layer"] == layer)
                        & (tops["head"] == head) & (tops["query"] == 4)
                        & (tops["kind"] == "key 0")]["value"].iloc[0]
    assert got["kind"] == "exact, a kept key" and float(got["exact"]) == first_weight

    # and back to the blocks
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-zoom-out").click()
    got = cell(browser, 1, 50)
    assert (got["key"], got["kind"]) == ("50", "block mean")
    assert float(got["exact"]) == means[layer, head, 1, 50]
    screenshot(browser, "long-prompt-overview", 420)

    # the keyboard: Enter zooms into the selected key's block, Escape goes back; the model
    # view draws the zoomed block for every layer and head
    browser.set_window_size(1400, 1400)
    press(browser, Keys.HOME, *[Keys.ARROW_RIGHT] * 5, Keys.ENTER)
    got = readout(browser)
    assert (got["block"], got["key"]) == ("5", "160") and got["kind"] != "block mean"
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-mode-model").click()
    assert readout(browser)["block"] == "5"
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-mode-head").click()
    press(browser, Keys.ESCAPE)
    got = readout(browser)
    assert (got["key"], got["kind"]) == ("5", "block mean")
    assert severe(browser) == [] and requests(browser) == []
