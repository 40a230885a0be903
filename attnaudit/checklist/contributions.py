"""Weights vs contributions: the tables of that report section and the judgement they give
on the misconception "a larger score always means a larger final contribution".

The numbers come from ``weights_vs_contributions`` (one row per measure: the share of
counted rows whose top key is not the top-weight key, the share whose top key is the top
leave-one-out key, the mean Kendall tau with leave-one-out); the judgement is the claim
:func:`attnaudit.checklist.claims.contribution_claim`, which the explanation verdict reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from attnaudit.checklist.claims import MATERIAL_SHARE, contribution_claim
from attnaudit.checklist.items import INCONCLUSIVE, NOT_SUPPORTED, NOT_TESTED, SUPPORTED

# The suite's tables that belong to the "weights vs contributions" section, not to the
# intervention item's evidence.
CONTRIBUTION_TABLES = ("weights_vs_contributions", "contribution_measures",
                       "contribution_agreement_summary", "sinks", "contribution_agreement",
                       "top_keys", "contribution_example", "alignment_aer", "alignment_counts")
__all__ = ["CONTRIBUTION_TABLES", "MATERIAL_SHARE", "contribution_lines",
           "larger_score_judgement"]
# The judgement is the claim "top_key_contributes" of the explanation verdict, so that the
# two read one number (its threshold MATERIAL_SHARE lives with the other claims').
JUDGEMENTS = {SUPPORTED: "not refuted here", NOT_SUPPORTED: "refuted",
              INCONCLUSIVE: "inconclusive"}


def larger_score_judgement(tables: Mapping[str, pd.DataFrame]) -> tuple[str, str] | None:
    """(``refuted``, ``not refuted here`` or ``inconclusive``, the sentence with its
    numbers), or None when no contribution measure was computed."""
    claim = contribution_claim(tables)
    if claim.status == NOT_TESTED:
        return None
    return JUDGEMENTS[claim.status], claim.answer


def contribution_lines(tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(sentence, misconception key) for the checklist's misconception notes."""
    judged = larger_score_judgement(tables)
    return [] if judged is None else [(judged[1], "larger_score")]
