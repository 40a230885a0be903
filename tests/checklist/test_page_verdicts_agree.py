"""On a written page (the bundled date BART, ``attnaudit report --quick`` on a few sources),
no two verdicts contradict each other: the explanation verdict, its claims, the
weights-vs-contributions judgement, the misconception note, claims.csv and the manifest
say the same; and --quick, which skips the adversarial search, cannot have it met."""

from __future__ import annotations

import json
import re

import pandas as pd

from attnaudit.checklist.items import (
    CLAIM_STATUSES,
    INCONCLUSIVE,
    NOT_SUPPORTED,
    NOT_TESTED,
    SUPPORTED,
)
from tests.helpers.report_page import read_page

JUDGEMENT_OF = {SUPPORTED: "not refuted here", NOT_SUPPORTED: "refuted",
                INCONCLUSIVE: "inconclusive"}


def test_the_page_verdicts_agree(cli_reports):
    folder = cli_reports("date_transformer")
    html = (folder / "index.html").read_text(encoding="utf-8")
    verdict = read_page(folder / "index.html").verdicts["verdict-explanation"]
    claims = dict(re.findall(r'id="claim-(\w+)" data-status="([^"]+)"', html))
    assert verdict in CLAIM_STATUSES
    assert set(claims.values()) <= set(CLAIM_STATUSES)
    # --quick: no adversarial search, so that criterion is not tested and the verdict
    # cannot be supported
    assert claims["unique_allocation"] == NOT_TESTED
    assert verdict != SUPPORTED
    # the weights-vs-contributions section states the same claim the verdict reads
    judged = re.search(r'id="judgement-larger-score" data-status="([^"]+)"', html)
    assert judged is not None
    assert judged.group(1) == JUDGEMENT_OF[claims["top_key_contributes"]]
    if claims["top_key_contributes"] == NOT_SUPPORTED or NOT_SUPPORTED in claims.values():
        assert verdict == NOT_SUPPORTED
    # the tables and the manifest hold the same answers as the page
    table = pd.read_csv(folder / "claims.csv")
    assert dict(zip(table["claim"], table["status"], strict=True)) == claims
    import attnaudit

    loaded = attnaudit.Audit.load(folder)
    assert dict(zip(loaded.claims["claim"], loaded.claims["status"], strict=True)) == claims
    assert loaded.verdicts["explanation"] == verdict
    verdicts = pd.read_csv(folder / "verdicts.csv")
    assert verdicts.set_index("verdict").loc["explanation", "status"] == verdict
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["explanation"]["status"] == verdict
    assert {k: v["status"] for k, v in manifest["explanation"]["claims"].items()} == claims
    notes = pd.read_csv(folder / "misconceptions.csv")
    causal = notes[notes["misconception"] == "Attention weights are causal explanations."]
    assert causal["evidence"].iloc[0].startswith(f"Explanation verdict: {verdict} ")
    # every summarised number carries its interval beside it, over the examples
    summary = pd.read_csv(folder / "summary.csv")
    share = summary.set_index("metric").loc["perm_small_tvd_share"]
    assert share["value_low"] <= share["value"] <= share["value_high"]
    assert manifest["interventions"]["bootstrap"]["resamples"] == 1000
