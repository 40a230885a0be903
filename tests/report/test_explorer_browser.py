"""The attention explorer in headless Chromium, read against ``attention_maps.csv``: the
mean over layers and over heads, the model view's pointer over maps whose cells are not
square (queries != keys), and the first view (where the page opens, its colour scale, its
axes, its title) of small date BART and date LSTM reports (four examples each)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import attnaudit
from attnaudit.targets.loading import load_target

BART = "attnaudit_examples.date_transformer.target:make_target"
EXAMPLES = 4
VIEWS = ["encoder_self", "decoder_self", "cross"]  # the date BART's, in the page's order


def _report(tmp_path_factory, spec: str | None) -> tuple:
    """A small report (four examples, no interventions) and its attention maps, indexed by
    example, view, measure, layer, head, query and key."""
    out = tmp_path_factory.mktemp("explorer")
    index = attnaudit.audit(load_target(spec), quick=True, limit=EXAMPLES,
                            interventions=False, progress=False).save(out)
    maps = pd.read_csv(out / "attention_maps.csv", keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    return index, maps


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    return _report(tmp_path_factory, BART)


@pytest.fixture(scope="module")
def lstm(tmp_path_factory):
    return _report(tmp_path_factory, None)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A decoder-only report: a tiny random GPT-2 continuing two prompts."""
    pytest.importorskip("transformers")
    from tests.helpers.tiny_targets import tiny_gpt2_report

    out = tiny_gpt2_report(tmp_path_factory, interventions=False)
    index = out / "index.html"
    maps = pd.read_csv(out / "attention_maps.csv", keep_default_na=False,
                       dtype={"query_token": str, "key_token": str})
    return index, maps


# where each model's explorer opens, and what that view's rows and columns are
OPENING = {"bart": (VIEWS.index("cross"), "emitted steps", "source tokens"),
           "lstm": (0, "emitted steps", "source tokens"),
           "gpt2": (1, "continuation steps", "prompt tokens")}


def grid(maps: pd.DataFrame, example: int, view: str) -> np.ndarray:
    """The weights of one example's view from the CSV: (layers, heads, queries, keys)."""
    rows = maps[(maps["example"] == example) & (maps["view"] == view)
                & (maps["measure"] == "weights")]
    shape = tuple(int(rows[c].max()) + 1 for c in ("layer", "head", "query", "key"))
    out = np.full(shape, np.nan)
    out[rows["layer"], rows["head"], rows["query"], rows["key"]] = rows["value"]
    return out


def open_page(browser, index) -> None:
    browser.get_log("browser")  # what earlier pages logged
    browser.set_window_size(1280, 1400)
    browser.get(index.as_uri())


def select(browser, control: str, value: object) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.CSS_SELECTOR, f".ax-explorer .{control}")
           ).select_by_value(str(value))


def readout(browser) -> dict[str, str]:
    return browser.execute_script(
        "return Object.assign({}, document.querySelector('.ax-explorer .ax-readout').dataset);")


def press(browser, *keys: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    browser.execute_script("document.querySelector('.ax-explorer .ax-canvas').focus();")
    ActionChains(browser).send_keys(*keys).perform()


def go_to(browser, step: int, key: int) -> None:
    """Select a step and key with the keyboard on the map (head view)."""
    from selenium.webdriver.common.keys import Keys

    press(browser, Keys.HOME, *[Keys.PAGE_UP] * 3, *[Keys.ARROW_DOWN] * step,
          *[Keys.ARROW_RIGHT] * key)


def point_at(browser, x: float, y: float) -> dict[str, str]:
    """Move the pointer to (x, y) CSS pixels from the canvas's top left; the readout."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    canvas = browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-canvas")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", canvas)
    width, height = browser.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height];", canvas)
    # selenium 4 offsets are from the element's centre
    ActionChains(browser).move_to_element_with_offset(
        canvas, round(x - width / 2), round(y - height / 2)).perform()
    return readout(browser)


def severe(browser) -> list:
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def requests(browser) -> list[str]:
    names = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name);")
    return [n for n in names if not n.startswith(("data:", "blob:"))]


def test_the_mean_over_layers_and_over_heads_is_the_mean_of_the_csv(browser, bart):
    index, maps = bart
    open_page(browser, index)
    for example, view, head, step, key in ((1, 2, 1, 3, 5), (2, 1, 3, 6, 2), (3, 0, 0, 4, 7)):
        weights = grid(maps, example, VIEWS[view])  # (layers, heads, queries, keys)
        select(browser, "ax-example", example)
        select(browser, "ax-view", view)
        select(browser, "ax-layer", "mean")
        select(browser, "ax-head", head)
        go_to(browser, step, key)
        got = readout(browser)
        assert (got["layer"], got["head"], got["query"], got["key"]) == (
            "mean", str(head), str(step), str(key))
        assert float(got["exact"]) == pytest.approx(weights[:, head, step, key].mean(),
                                                    rel=1e-12)
        select(browser, "ax-layer", 1)
        select(browser, "ax-head", "mean")
        got = readout(browser)
        assert (got["layer"], got["head"]) == ("1", "mean")
        assert float(got["exact"]) == pytest.approx(weights[1, :, step, key].mean(), rel=1e-12)
        select(browser, "ax-layer", "mean")
        assert float(readout(browser)["exact"]) == pytest.approx(
            weights[:, :, step, key].mean(), rel=1e-12)
        # the head view's map under the pointer shows the same means, cell by cell
        select(browser, "ax-head", head)
        (drawn,) = browser.execute_script(
            "return window.attnauditExplorers[0].scene.items.filter(i => i.t === 'map')"
            ".map(i => [i.x, i.y, i.w, i.h]);")
        x, y, w, h = drawn
        queries, keys = weights.shape[2:]
        for q, k in ((0, 0), (queries - 1, keys - 1), (queries // 2, keys // 3)):
            got = point_at(browser, x + (k + 0.5) * w / keys, y + (q + 0.5) * h / queries)
            assert (got["layer"], got["query"], got["key"]) == ("mean", str(q), str(k))
            assert float(got["exact"]) == pytest.approx(weights[:, head, q, k].mean(),
                                                        rel=1e-12)
    assert severe(browser) == []


def model_view_maps(browser) -> list[dict]:
    """Each map the model view draws, its rectangle (CSS pixels) and its layer and head
    from its place in the grid: rows of maps are layers, columns are heads."""
    drawn = browser.execute_script(
        "return window.attnauditExplorers[0].scene.items.filter(i => i.t === 'map')"
        ".map(i => ({x: i.x, y: i.y, w: i.w, h: i.h}));")
    rows = sorted({m["y"] for m in drawn})
    columns = sorted({m["x"] for m in drawn})
    return [{**m, "layer": rows.index(m["y"]), "head": columns.index(m["x"])} for m in drawn]


@pytest.mark.parametrize("model", ["bart", "lstm"])
def test_the_model_view_maps_the_pointer_to_cells_that_are_not_square(browser, model,
                                                                      request):
    from selenium.webdriver.common.by import By

    index, maps = request.getfixturevalue(model)
    open_page(browser, index)
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-mode-model").click()
    for example in (0, 3):
        select(browser, "ax-example", example)
        view = VIEWS.index("cross") if model == "bart" else 0
        select(browser, "ax-view", view)
        weights = grid(maps, example, "cross")
        layers, heads, queries, keys = weights.shape
        assert queries != keys  # the cells are not square
        drawn = model_view_maps(browser)
        assert sorted((m["layer"], m["head"]) for m in drawn) == [
            (layer, head) for layer in range(layers) for head in range(heads)]
        checked = 0
        for m in drawn:
            cell_w, cell_h = m["w"] / keys, m["h"] / queries
            assert min(cell_w, cell_h) >= 6  # room to aim at a cell's centre
            for q, k in ((queries - 1, 0), (queries // 2, keys - 1)):
                got = point_at(browser, m["x"] + (k + 0.5) * cell_w,
                               m["y"] + (q + 0.5) * cell_h)
                where = (m["layer"], m["head"], q, k)
                assert (got["layer"], got["head"], got["query"], got["key"]) == tuple(
                    map(str, where)), (model, example, where)
                assert float(got["exact"]) == pytest.approx(weights[where], rel=1e-6)
                checked += 1
        assert checked == 2 * layers * heads
    assert severe(browser) == [] and requests(browser) == []


def opening_head(maps: pd.DataFrame, view: str) -> tuple[tuple[int, int], float]:
    """The (layer, head) of ``view`` whose rows have the highest mean max weight over every
    kept example's query rows, from the CSV; and that mean."""
    rows = maps[(maps["view"] == view) & (maps["measure"] == "weights")]
    peaks = rows.groupby(["example", "layer", "head", "query"])["value"].max()
    means = peaks.groupby(["layer", "head"]).mean()
    return means.idxmax(), float(means.max())


@pytest.mark.parametrize("model", ["bart", "lstm", "gpt2"])
def test_the_explorer_opens_on_the_most_concentrated_cross_attention_head(browser, model,
                                                                          request):
    from selenium.webdriver.common.by import By

    index, maps = request.getfixturevalue(model)
    open_page(browser, index)
    (layer, head), value = opening_head(maps, "cross")
    view, rows, columns = OPENING[model]
    values = browser.execute_script(
        "return ['.ax-example', '.ax-view', '.ax-layer', '.ax-head', '.ax-scale']"
        ".map(s => document.querySelector('.ax-explorer ' + s).value);")
    assert values == ["0", str(view), str(layer), str(head), "map"]
    got = readout(browser)
    assert (got["example"], got["view"], got["layer"], got["head"]) == (
        "0", "cross", str(layer), str(head))
    opened = browser.execute_script(
        "return Object.assign({}, document.querySelector('.ax-explorer .ax-opened').dataset);")
    assert opened["statistic"] == "mean max weight"
    assert float(opened["value"]) == pytest.approx(value, rel=1e-6)
    # the colour scale: 0 to this map's maximum, in the legend and at the colour bar's end
    weights = grid(maps, 0, "cross")
    legend = browser.execute_script(
        "return Object.assign({}, document.querySelector('.ax-explorer .ax-legend').dataset);")
    top = format(float(np.nanmax(weights[layer, head])), ".4g")
    assert (legend["scale"], legend["lo"], legend["hi"]) == ("map", "0", top)
    texts = browser.execute_script(
        "return window.attnauditExplorers[0].scene.items.filter(i => i.t === 'text')"
        ".map(i => i.text);")
    assert top in texts
    assert f"rows: {rows}; columns: {columns}" in texts
    assert f"rows: {rows}, columns: {columns}" in browser.find_element(
        By.CSS_SELECTOR, ".ax-explorer .ax-canvas").get_attribute("aria-label")
    select(browser, "ax-scale", "fixed")
    legend = browser.execute_script(
        "return Object.assign({}, document.querySelector('.ax-explorer .ax-legend').dataset);")
    assert (legend["scale"], legend["lo"], legend["hi"]) == ("fixed", "0", "1")
    if model == "bart":  # every view names its rows and columns
        select(browser, "ax-view", VIEWS.index("encoder_self"))
        assert "rows: source tokens, columns: source tokens" in browser.find_element(
            By.CSS_SELECTOR, ".ax-explorer .ax-canvas").get_attribute("aria-label")
    # the model view's title is whole, within the canvas; the figure does not overflow
    browser.find_element(By.CSS_SELECTOR, ".ax-explorer .ax-mode-model").click()
    fit = browser.execute_script("""
        const ex = window.attnauditExplorers[0], title = ex.scene.items[0];
        const ctx = document.createElement('canvas').getContext('2d');
        ctx.font = title.weight + " 11px system-ui, -apple-system, 'Segoe UI', sans-serif";
        const figure = document.querySelector('.ax-explorer .ax-figure');
        return [title.text, title.x + ctx.measureText(title.text).width,
                ex.canvas.getBoundingClientRect().width, figure.scrollWidth,
                figure.clientWidth];""")
    title, right, canvas_width, scroll_width, client_width = fit
    assert title.endswith(": weights, every layer and head") and "\u2026" not in title
    assert right <= canvas_width and scroll_width <= client_width, fit
    assert severe(browser) == [] and requests(browser) == []
