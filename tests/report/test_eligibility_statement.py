"""The page states the two eligibility rules side by side: the maps count source ``</s>``,
the interventions do not; and metrics.md says the same."""

from __future__ import annotations

import attnaudit
from attnaudit.report.definitions import DEFINITIONS
from tests.helpers.toys.masking import make_target


def test_report_page_and_definitions_state_both_rules(tmp_path):
    target = make_target(sources=([3, 4, 5, 6], [3, 6]))
    text = attnaudit.audit(target, quick=True, progress=False).save(tmp_path).read_text(
        encoding="utf-8")
    start = text.index('<section id="eligibility"')
    section = text[start:text.index("</section>", start)]
    assert "source <code>&lt;/s&gt;</code> included" in section  # the maps' rule
    assert "as ineligible" in section and "uniform gives them weight 0" in section
    definitions = DEFINITIONS.read_text(encoding="utf-8")
    assert "- Side by side: the maps (heatmaps, explorer) and the validity checks count" \
           " source\n  ``</s>`` as an eligible key" in definitions
