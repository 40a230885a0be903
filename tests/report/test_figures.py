"""The report's figures say what the tables say: violin bins labelled as the bins table,
agreement bars with intervals and the Jain & Wallace band, heatmaps whose spaces show and
whose size follows the sequence, within bounds."""

from __future__ import annotations

import itertools
import warnings

import matplotlib.patches
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer

from attnaudit.report import figures as figs
from attnaudit.report.item_figures import N_BOOTSTRAP

# Jain & Wallace (2019), mean Kendall tau between attention and gradient importance, from
# the paper: CNN 0.24 (lowest) to IMDB 0.44 (highest).
JAIN_WALLACE_LOW, JAIN_WALLACE_HIGH = 0.24, 0.44


@pytest.fixture(scope="module")
def date_audit(api_audits):
    audit, _, _ = api_audits("date")
    return audit


def test_violin_bins_are_labelled_as_the_bins_table(date_audit):
    ax = date_audit.figure("permutation_tvd").axes[0]
    shown = [label.get_text() for label in ax.get_xticklabels()]
    table = date_audit.tables["permutation_bins"]
    assert shown == [b for b in table["bin"] if b != "all"]
    # and each violin holds the rows the table counts in that bin
    rows = date_audit.tables["rows"]
    edges = [float(b) for b in shown] + [1.0]
    value = rows["max_attention"]
    counted = [int((((value > lo) | (lo == 0)) & (value <= hi)).sum())
               for lo, hi in itertools.pairwise(edges)]
    assert counted == [int(n) for n in table["n"].iloc[:-1]]


def test_agreement_bars_have_intervals_and_the_jain_wallace_band(date_audit):
    ax = date_audit.figure("agreement").axes[0]
    [bars] = [c for c in ax.containers if isinstance(c, BarContainer)]
    summary = date_audit.tables["agreement_summary"]
    means = summary["kendall_tau_mean"].to_numpy()
    np.testing.assert_allclose([b.get_height() for b in bars.patches], means, rtol=1e-9)
    segments = bars.errorbar.lines[2][0].get_segments()
    low = np.array([segment[0][1] for segment in segments])
    high = np.array([segment[1][1] for segment in segments])
    assert (low < means).all() and (means < high).all()
    # a resampling-by-example interval: about 2 x 1.96 standard errors of the mean of the
    # per-example means (independently recomputed here), not of the rows
    rows = date_audit.tables["agreement"]
    rows = rows[rows["kendall_tau"].notna()]
    for (a, b), group in rows.groupby(["method_a", "method_b"], sort=False):
        per_example = group.groupby("example")["kendall_tau"].mean()
        se = per_example.std(ddof=1) / np.sqrt(len(per_example))
        i = summary.index[(summary["method_a"] == a) & (summary["method_b"] == b)][0]
        assert high[i] - low[i] == pytest.approx(2 * 1.96 * se, rel=0.5), (a, b)
    [band] = [p for p in ax.patches if p.get_label().startswith("Jain & Wallace")]
    ys = ((band.get_y(), band.get_y() + band.get_height())
          if isinstance(band, matplotlib.patches.Rectangle) else band.get_xy()[:, 1])
    assert (min(ys), max(ys)) == pytest.approx((JAIN_WALLACE_LOW, JAIN_WALLACE_HIGH))
    assert N_BOOTSTRAP >= 1000


def test_heatmap_shows_spaces_and_word_markers():
    tokens = [" ", "Ġthe", "▁cat", "", "a\n", "x"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing glyph would warn
        figure = figs.attention_heatmap("m", np.full((2, 6), 1 / 6), tokens, ["Ġy", "z"],
                                        title="t", caption="c")
        assert figure.data_uri.startswith("data:image/png;base64,")
    ax = figure.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["␣", "␣the", "␣cat", "∅", "a↵",
                                                             "x"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["␣y", "z"]
    assert "␣the" in figure.alt and "Spaces are drawn as ␣" in figure.caption


def test_date_heatmap_marks_every_space_of_the_source(date_audit):
    example = date_audit.validity.example
    ax = date_audit.figure("example_map_0").axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert "".join(labels) == example.source.replace(" ", "␣")
    assert labels.count("␣") == example.source.count(" ") > 0


def _size(queries: int, keys: int) -> tuple[float, float]:
    figure = figs.attention_heatmap("m", np.ones((queries, keys)) / keys,
                                    [f"k{i}" for i in range(keys)],
                                    [f"q{i}" for i in range(queries)], title="t", caption="c")
    return tuple(figure.figure.get_size_inches())


def test_heatmap_grows_with_the_sequence_within_bounds():
    widths = [_size(4, k)[0] for k in (5, 20, 40, 60, 200)]
    heights = [_size(q, 10)[1] for q in (5, 20, 40, 60, 200)]
    for sizes in (widths, heights):
        assert sizes[1] < sizes[2] < sizes[3] and sizes[3] == sizes[4] < 16
    assert _size(4, 200)[0] == _size(4, figs.MAX_HEATMAP_KEYS)[0]


def test_violin_labels_follow_the_table_on_hand_made_rows():
    from attnaudit.report.item_figures import item_figures

    rows = pd.DataFrame({"max_attention": [0.0, 0.25, 0.26, 0.5, 0.9, 1.0],
                         "perm_median_tvd": [0.01, 0.02, 0.3, 0.4, 0.5, 0.6]})
    [violin] = [f for f in item_figures({"rows": rows}, None, None)["interventions"]]
    shown = [t.get_text() for t in violin.figure.axes[0].get_xticklabels()]
    assert shown == ["0.00", "0.25", "0.50", "0.75"]
    assert "0.00: 2 rows" in violin.alt and "0.25: 2 rows" in violin.alt  # 0.25 closes bin 0


def test_target_side_heatmap_beside_the_source_one_only_when_target_side_ran(date_audit):
    from attnaudit.attribution.options import AttributionOptions
    from attnaudit.auditing.intervention_suite import run_suite
    from attnaudit.report.item_figures import item_figures
    from attnaudit_examples.date.target import make_target

    suite = run_suite(make_target(limit=2), quick=True, progress=False, n_permutations=2,
                      cumulative_examples=1,
                      attribution=AttributionOptions(target_side=True))
    [sides] = [f for f in item_figures(suite.tables, None, None)["interventions"]
               if f.name == "attribution_sides"]
    source_ax, prefix_ax = sides.figure.axes[:2]
    prefix = suite.tables["attribution_prefix"]
    prefix = prefix[(prefix.example == 0) & (prefix.method == "input_x_gradient")]
    steps = sorted(prefix.step.unique())
    drawn = prefix_ax.collections[0].get_array().reshape(len(steps), -1)
    for row, step in enumerate(steps):
        at = prefix[prefix.step == step].sort_values("key")
        np.testing.assert_allclose(drawn[row, : step + 1].filled(np.nan), at.importance)
        assert drawn.mask[row, step + 1 :].all()  # positions after the step: blank
    words = suite.tables["word_importance"]
    words = words[words.method == "input_x_gradient"]
    shown = [t.get_text() for t in source_ax.get_xticklabels()]
    assert shown == [figs.visible_token(w) for w in
                     words.drop_duplicates("word").sort_values("word").word_text]
    emitted = list(words.drop_duplicates("step").sort_values("step").target_token)
    assert [t.get_text() for t in prefix_ax.get_xticklabels()] == [
        "<start>", *[figs.visible_token(t) for t in emitted[:-1]]]
    without = {k: v for k, v in suite.tables.items() if k != "attribution_prefix"}
    assert "attribution_sides" not in [f.name for f in item_figures(without, None, None)[
        "interventions"]]
    assert "attribution_sides" not in date_audit.figure_names()


# what a static heatmap's rows and columns are, by the site's role
AXIS_LABELS = {"encoder_self": ("source tokens (queries)", "source tokens (keys)"),
               "decoder_self": ("emitted steps (queries)", "decoder inputs (keys)"),
               "cross": ("emitted steps (queries)", "source tokens (keys)")}


@pytest.mark.parametrize("name", ["date", "date_transformer"])
def test_heatmap_axes_say_what_the_rows_are(api_audits, name):
    audit, _, _ = api_audits(name)
    maps = [m for m in audit.validity.example.maps.values() if 0 not in m.weights.shape]
    assert maps
    for index, amap in enumerate(maps):
        ax = audit.figure(f"example_map_{index}").axes[0]
        assert (ax.get_ylabel(), ax.get_xlabel()) == AXIS_LABELS[amap.role], amap.site
    roles = {m.role for m in maps}
    assert roles == ({"cross"} if name == "date" else set(AXIS_LABELS))


def test_side_by_side_panels_wrap_and_keep_their_tick_size():
    assert figs.panel_rows([4.0, 4.0, 4.0, 4.0, 14.0, 1.0]) == [[0, 1, 2], [3], [4], [5]]
    keys = [f"k{i}" for i in range(18)]
    panels = [(np.full((10, 18), 1 / 18), keys, f"measure {i}") for i in range(6)]
    figure = figs.paired_heatmaps("p", panels, [f"s{i}" for i in range(10)], title="t",
                                  caption="c", value_label="share")
    width, _ = figure.figure.get_size_inches()
    assert width <= figs.MAX_ROW_INCHES
    heatmaps = [ax for ax in figure.figure.axes if ax.get_xlabel().startswith("measure")]
    assert [ax.get_xlabel() for ax in heatmaps] == [f"measure {i}" for i in range(6)]
    assert len({round(ax.get_position().y0, 3) for ax in heatmaps}) == 3  # two per row
    sizes = {label.get_fontsize() for ax in heatmaps for label in ax.get_xticklabels()}
    assert sizes == {figs.TICK_PT}
    png_width, _ = figure.pixels
    assert figure.min_width >= figs.MIN_SCALE * png_width
    assert figs.MIN_SCALE * figs.TICK_PT * figs.DPI / 72 >= 9  # pixels at the narrowest


def test_the_contribution_panels_name_their_rows_by_the_targets_family():
    from pathlib import Path

    from attnaudit.record import Family
    from attnaudit.report.contributions import contribution_figures

    report = Path(__file__).resolve().parents[2] / "reports" / "date_bart"
    tables = {"contribution_example": pd.read_csv(report / "contribution_example.csv")}
    for family, rows in ((Family.ENCODER_DECODER, "emitted token (step)"),
                         (Family.DECODER_ONLY, "continuation token (step)")):
        (figure,) = contribution_figures(tables, family)
        assert figure.figure.axes[0].get_ylabel() == rows
        assert ("prompt tokens" in figure.caption) == (family == Family.DECODER_ONLY)
