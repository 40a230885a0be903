"""User-provided strings (tokens, names, descriptions) render as text, never as markup."""

from __future__ import annotations

import html

import attnaudit
from attnaudit.checklist import ITEM_KEYS
from attnaudit.report.explorer_page import SCRIPTS
from tests.helpers.report_page import page_data, read_page
from tests.helpers.toys.masking import make_target

SCRIPT = "<script>alert(1)</script>"
LABELS = ["<pad>", "<s>", "</s>", SCRIPT, "a&b", '"q"', "$x_1$", "z"]
SOURCES = ([3, 4, 5, 6], [3, 6])


def test_markup_in_tokens_and_names_is_escaped(tmp_path):
    target = make_target(sources=SOURCES, labels=LABELS, name=f"tiny {SCRIPT}",
                         description=f"description with {SCRIPT} and <b>bold</b>")
    out = tmp_path / "out <i>dir</i>"
    audit = attnaudit.audit(target, quick=True, progress=False,
                            command_line=["attnaudit", "report", f"x{SCRIPT}.py:make"])
    path = audit.save(out)
    text = path.read_text(encoding="utf-8")
    assert SCRIPT not in text
    assert "<b>bold</b>" not in text
    assert html.escape(SCRIPT, quote=False) in text
    page = read_page(path)
    assert page.scripts == len(SCRIPTS) + 1  # the explorer's own scripts and its data
    # the explorer's data holds the labels as JSON strings; its script draws them as text
    views = page_data(text)["examples"][0]["views"]
    assert any(SCRIPT in view["keys"] for view in views)
    assert list(page.sections) == list(ITEM_KEYS)
    # The heatmap's alt text names the tokens: as text, the attribute holds the raw label.
    heatmaps = [img for img in page.images if img["alt"].startswith("Heatmap")]
    assert heatmaps and all(SCRIPT in img["alt"] for img in heatmaps)


def test_leaking_mask_fails_the_validity_verdict(tmp_path):
    target = make_target("after_softmax", SOURCES, labels=LABELS)
    path = attnaudit.audit(target, quick=True, progress=False).save(tmp_path)
    page = read_page(path)
    assert page.verdicts["verdict-validity"] == "fail"
    # the explorer marks the rows of padded examples that put weight on their padding (the
    # padding keys themselves are not drawn: the masked mass is counted over the whole row)
    examples = page_data(path.read_text(encoding="utf-8"))["examples"]
    flagged = {e["index"] for e in examples for view in e["views"]
               for row in view["failing_rows"] if "masked mass" in row["checks"]}
    padded = {i for i, source in enumerate(SOURCES) if len(source) < max(map(len, SOURCES))}
    assert flagged == padded
    assert page.sections["eligibility"] == "fail"
    assert page.sections["distributions"] == "fail"
