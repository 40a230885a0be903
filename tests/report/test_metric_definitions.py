"""The metric definitions ship with the package and are rendered into every report."""

from __future__ import annotations

import re

import attnaudit
from attnaudit.report.definitions import DEFINITIONS, definition_blocks
from tests.helpers.toys.masking import make_target


def test_definitions_parse_into_headings_paragraphs_and_items():
    blocks = definition_blocks("# T\n\nIntro `a` and\nmore.\n\n## H\n- one\n  cont `x`\n- two\n")
    assert [b.kind for b in blocks] == ["title", "paragraph", "heading", "item", "item"]
    assert blocks[1].parts == ((False, "Intro "), (True, "a"), (False, " and more."))
    assert blocks[3].parts == ((False, "one cont "), (True, "x"))


def test_every_metric_the_tables_name_is_defined():
    text = DEFINITIONS.read_text(encoding="utf-8")
    for name in ("masked_mass", "row_sum_error", "entropy_norm", "region_mass", "top_weight_hit",
                 "perm_median_tvd", "share_small_tvd", "eps_max_jsd", "value_zero_tvd",
                 "sig_frac", "softmax_axis_suspect", "layout_source"):
        assert re.search(rf"``{name}\b", text), name


def test_the_report_carries_the_definitions(tmp_path):
    target = make_target(sources=([3, 4, 5, 6], [3, 6]))
    text = attnaudit.audit(target, quick=True, progress=False).save(tmp_path).read_text("utf-8")
    appendix = text[text.index('id="definitions"'):]
    headings = re.findall(r"<h3>(.*?)</h3>", appendix)
    assert "Interventions (defaults)" in headings and "Output change" in headings
    assert "<code>masked_mass</code>" in appendix
