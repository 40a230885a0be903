"""The report in headless Chromium: no console errors, every image loads, every section.

The ``browser`` fixture (``tests/report/conftest.py``) is skipped, with the reason, only
where Debian's chromium and chromium-driver are not installed. The full-page screenshot
goes to pytest's temporary directory, outside the checkout.
"""

from __future__ import annotations

import attnaudit
from attnaudit.checklist import ITEM_KEYS, STATUSES
from attnaudit.targets.loading import load_target


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
    # long sections are collapsed; opened, every table sits in a box
    assert not any(browser.execute_script(
        "return Array.from(document.querySelectorAll('details')).map(d => d.open);"))
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true);")
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


# The attention explorer of the date BART report (``attnaudit report`` with its default
# five examples): values read off the page on focus and on hover against the CSV, to the
# page's printed precision (Python's ".4g", as the report's tables print numbers).

def _select(browser, control: str, value: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.CSS_SELECTOR, f".ax-explorer .{control}")
           ).select_by_value(str(value))


def _press(browser, element, *keys: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    browser.execute_script("arguments[0].focus();", element)
    ActionChains(browser).send_keys(*keys).perform()


def _readout(browser) -> dict[str, str]:
    return browser.execute_script(
        "return Object.assign({}, document.querySelector('.ax-explorer .ax-readout').dataset);")


def _hover(browser, canvas, query: int, key: int) -> dict[str, str]:
    """Move the pointer over a cell of the first map drawn (the head view's map)."""
    from selenium.webdriver.common.action_chains import ActionChains

    hit, width, height = browser.execute_script(
        "const c = arguments[0]; const r = c.getBoundingClientRect();"
        "return [window.attnauditExplorers[0].scene.hits[0], r.width, r.height];", canvas)
    x = hit["x"] + (key - hit["k0"] + 0.5) * hit["cw"] - width / 2
    y = hit["y"] + (query - hit["q0"] + 0.5) * hit["ch"] - height / 2
    ActionChains(browser).move_to_element_with_offset(canvas, int(x), int(y)).perform()
    return _readout(browser)


def _png_size(data_uri: str) -> tuple[int, int]:
    import base64
    import struct

    raw = base64.b64decode(data_uri.split(",", 1)[1])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) > 1000
    return struct.unpack(">II", raw[16:24])


def _check_exports(browser) -> None:
    import xml.etree.ElementTree as ET

    size = browser.execute_script(
        "const c = document.querySelector('.ax-explorer .ax-canvas');"
        "return [+c.dataset.width, +c.dataset.height];")
    png = browser.execute_script("return window.attnauditExplorers[0].exportImage('png');")
    assert list(_png_size(png)) == [round(v) for v in size]
    svg = ET.fromstring(browser.execute_script(
        "return window.attnauditExplorers[0].exportImage('svg');"))
    ns = "{http://www.w3.org/2000/svg}"
    assert [float(svg.get("width")), float(svg.get("height"))] == size
    assert svg.findall(f"{ns}image") and len(svg.findall(f"{ns}text")) > 5


TAB_ORDER = ["ax-example", "ax-view", "ax-measure", "ax-scale", "ax-mode-model", "ax-mode-head",
             "ax-layer", "ax-head", "ax-step", "ax-export-png", "ax-export-svg", "ax-canvas"]


def test_the_attention_explorer_in_chromium(browser, cli_reports, tmp_path):
    import time

    import pandas as pd
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    report = cli_reports("date_transformer")
    maps = pd.read_csv(report / "attention_maps.csv", keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    cell = maps.set_index(["example", "view", "measure", "layer", "head", "query", "key"])
    browser.set_window_size(1280, 1400)
    started = time.perf_counter()
    browser.get((report / "index.html").as_uri())
    load_ms = browser.execute_script(
        "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd;")
    size = (report / "index.html").stat().st_size
    print(f"date BART report: {size / 1e6:.2f} MB, loaded in {load_ms:.0f} ms "
          f"(selenium get: {time.perf_counter() - started:.2f} s)")
    assert size <= 3_000_000 and 0 < load_ms < 10_000
    assert browser.execute_script("return window.attnauditExplorers.length;") == 1
    canvas = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-canvas")
    views = ["encoder_self", "decoder_self", "cross"]

    def expect(example, view, layer, head, query, key, measure="weights"):
        value = cell.loc[(example, view, measure, layer, head, query, key), "value"]
        return {"value": format(float(value), ".4g"), "example": str(example), "view": view,
                "layer": str(layer), "head": str(head), "query": str(query),
                "key": str(key), "measure": measure}

    def shown(keys=("value", "example", "view", "layer", "head", "query", "key", "measure")):
        got = _readout(browser)
        return {k: got[k] for k in keys}

    for example, view, layer, head, step in ((0, 2, 1, 2, 3), (3, 0, 0, 1, 2), (4, 1, 1, 3, 5)):
        _select(browser, "ax-example", example)
        _select(browser, "ax-view", view)
        _select(browser, "ax-layer", layer)
        _select(browser, "ax-head", head)
        step_input = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-step")
        _press(browser, step_input, Keys.HOME, *[Keys.ARROW_RIGHT] * step)
        _press(browser, canvas, Keys.HOME)
        for key in range(4):  # focus: the current step, key after key
            assert shown() == expect(example, views[view], layer, head, step, key)
            _press(browser, canvas, Keys.ARROW_RIGHT)
        _press(browser, canvas, Keys.ARROW_UP)
        assert shown() == expect(example, views[view], layer, head, step - 1, 4)
        for query, key in ((0, 0), (step, 1), (1, 6)):  # hover
            got = _hover(browser, canvas, query, key)
            assert {k: got[k] for k in expect(0, "cross", 0, 0, 0, 0)} == expect(
                example, views[view], layer, head, query, key)
        _check_exports(browser)
    # the mean over heads, computed by the page from the same numbers
    _select(browser, "ax-head", "mean")
    _press(browser, canvas, Keys.HOME)
    values = [cell.loc[(4, "decoder_self", "weights", 1, h, 4, 0), "value"] for h in range(4)]
    assert _readout(browser)["value"] == format(sum(values) / 4, ".4g")
    # the model view: arrows move layer and head, Enter opens the head
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-mode-model").click()
    _press(browser, canvas, Keys.ARROW_UP, Keys.ARROW_LEFT, Keys.ARROW_DOWN, Keys.ARROW_RIGHT)
    assert shown() == expect(4, "decoder_self", 1, 1, 4, 0)
    _check_exports(browser)
    _press(browser, canvas, Keys.ENTER)
    assert browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-mode-head"
                                ).get_attribute("aria-pressed") == "true"
    # the buttons download without a network request
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-export-png").click()
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-export-svg").click()
    requests = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name);")
    assert [r for r in requests if not r.startswith(("data:", "blob:"))] == []
    # the keyboard reaches every control, in order; each is labelled for screen readers
    _press(browser, browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-example"))
    order = [browser.execute_script("return document.activeElement.className;")]
    for _ in TAB_ORDER[1:]:
        _press(browser, browser.switch_to.active_element, Keys.TAB)
        order.append(browser.execute_script("return document.activeElement.className;"))
    assert order == TAB_ORDER
    unlabelled = browser.execute_script("""
        return Array.from(document.querySelectorAll('.ax-explorer select, .ax-explorer input'))
          .filter(c => !(c.closest('label') && c.closest('label').textContent.trim()))
          .map(c => c.className);""")
    assert unlabelled == []
    assert canvas.get_attribute("aria-label").startswith("Head view: ")
    readout = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-readout")
    assert readout.get_attribute("aria-live") == "polite" and "query" in readout.text
    # a narrow window: the explorer and its controls fit the page, the map scrolls inside
    # its box, the values still read
    browser.set_window_size(420, 1200)
    browser.execute_script("arguments[0].scrollIntoView();", canvas)
    widths = browser.execute_script("""
        const root = document.querySelector('.ax-explorer');
        const figure = root.querySelector('.ax-figure');
        return [root.getBoundingClientRect().right, document.documentElement.clientWidth,
                root.scrollWidth, root.clientWidth, getComputedStyle(figure).overflowX];""")
    assert widths[0] <= widths[1] and widths[2] <= widths[3], widths
    assert widths[4] == "auto"
    _press(browser, canvas, Keys.HOME)
    assert shown()["value"] == expect(4, "decoder_self", 1, 1, 4, 0)["value"]
    assert browser.find_element(By.CSS_SELECTOR, ".ax-explorer").screenshot(
        str(tmp_path / "explorer-narrow.png"))
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []


def test_a_long_capture_in_chromium_is_windowed_and_every_measure_shows(browser, tmp_path):
    """A bare capture (attnaudit.show) of 300 tokens: drawn through a 256-token window,
    not cut; a second measure plugged in as an array shows without any script change."""
    import numpy as np
    import torch
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 300, 8)
    with torch.no_grad(), attnaudit.capture(module) as cap:
        _, weights = module(x, x, x, average_attn_weights=False)
    weights = weights[0].numpy().astype(np.float64)  # (2, 300, 300)
    norms = np.random.default_rng(0).normal(size=(2, 300, 300)).astype(np.float32)
    page = attnaudit.show(cap, [f"t{i}" for i in range(300)],
                          measures={"value_norm": {cap.sites[0]: norms}})
    browser.set_window_size(1280, 1400)
    browser.get(page.save(tmp_path / "long.html").as_uri())
    canvas = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-canvas")
    assert browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-window").is_displayed()
    _press(browser, canvas, Keys.END, *[Keys.PAGE_DOWN] * 30)  # the last key, the last row
    got = _readout(browser)
    assert (got["query"], got["key"]) == ("299", "299")
    assert got["value"] == format(weights[0, 299, 299], ".4g")
    starts = browser.execute_script(
        "return ['.ax-qstart', '.ax-kstart'].map(s => +document.querySelector(s).value);")
    assert starts == [44, 44]  # the window moved to keep the cell in view
    _select(browser, "ax-head", 1)
    _select(browser, "ax-measure", "value_norm")
    assert _readout(browser)["value"] == format(float(norms[1, 299, 299]), ".4g")
    _select(browser, "ax-head", "mean")
    assert _readout(browser)["value"] == format(
        (float(norms[0, 299, 299]) + float(norms[1, 299, 299])) / 2, ".4g")
    _check_exports(browser)
    # findings on the map: an ineligible key that received weight, a row whose sum is off
    from attnaudit.record import AttentionCall, AttentionRecord, Site

    leaky = torch.full((1, 2, 3, 4), 1 / 3)
    leaky[..., 3] = 0.0
    leaky[0, 1, 2] = torch.tensor([0.3, 0.3, 0.2, 0.2])  # 0.2 on the masked key 3
    record = AttentionRecord(Site("attn:self", "self", "softmax", "attn"))
    record.append(AttentionCall(leaky, mask_source=lambda: torch.tensor([1, 1, 1, 0]).bool()))
    browser.get(attnaudit.show(record, list("abcd")).save(tmp_path / "leaky.html").as_uri())
    canvas = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-canvas")
    _select(browser, "ax-head", 1)
    _press(browser, canvas, Keys.PAGE_DOWN, Keys.END)
    got = _readout(browser)
    assert (got["query"], got["key"], got["value"], got["flags"]) == ("2", "3", "0.2", "2")
    text = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-readout").text
    assert "ineligible key received weight" in text and "masked mass check" in text
    _press(browser, canvas, Keys.ARROW_UP)
    assert _readout(browser)["flags"] == "0"
    # the page decodes both encodings as Python does (8 bits: approximate, a scale per map)
    from attnaudit.report.explorer import decode, encode

    array = np.random.default_rng(2).normal(size=(2, 3, 4, 5)).astype(np.float32)
    array[1, 0, 2, 3] = np.nan
    for encoding in ("f32", "u8"):
        measure = encode(array, encoding)
        got = browser.execute_script(
            "return Array.from(window.AttnauditExplorer.decodeMeasure(arguments[0], "
            "arguments[1]).values);", measure, list(array.shape))
        expected = decode(measure, array.shape).ravel()
        assert got[int(np.flatnonzero(np.isnan(expected))[0])] is None  # NaN comes back null
        np.testing.assert_allclose(np.array(got, dtype=float), expected, rtol=1e-12,
                                   equal_nan=True)
    # numbers as Python prints them with ".4g", ties rounded half to even
    values = [0.015625, 0.125, 0.5, 1.0, 0.0, 1e-05, 1.23456e-05, 0.00012345, 12345.678,
              9.99951, 0.99995, 0.099995, 2.5e-07, -0.03125, 1234.5, 123.45, 0.0001,
              *np.random.default_rng(1).random(200).astype(np.float32).tolist()]
    formatted = browser.execute_script(
        "return arguments[0].map(window.AttnauditExplorer.formatValue);", values)
    assert formatted == [format(v, ".4g") for v in values]
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
