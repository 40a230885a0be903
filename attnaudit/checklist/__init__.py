"""The audit checklist: findings mapped onto the eight items an attention audit should record.

The items, their wording and the misconceptions come from the source text "Attention
modules need targeted tests" (seed 003). Each item gets a status — ``pass``, ``warn``,
``fail`` or ``not recorded`` — what was measured and how, and its evidence as tidy tables.
Two verdicts sit on top: whether the attention is a valid weighted retrieval computation
(from the validity findings) and how much support the interventions give to explanatory
claims. Plain data and functions only; the report renders it. ``items`` holds the items,
misconceptions and result types; ``retrieval`` the items on the retrieval computation and
the verdict on its validity; ``performance`` the performance item; ``evidence_tables`` the
tables read off the model and the metrics; ``explanation`` the intervention item and the
verdict on explanatory claims, ``claims`` the claims that verdict answers with their
thresholds; ``build`` :func:`build_checklist`, which puts them
together. This module only re-exports.
"""


from attnaudit.checklist.build import build_checklist
from attnaudit.checklist.claims import ADVERSARIAL_DIFFERENT, explanation_claims
from attnaudit.checklist.evidence_tables import parameter_table, site_metric_table
from attnaudit.checklist.explanation import agreement_summary, explanation_status
from attnaudit.checklist.items import (
    CLAIM_STATUSES,
    FAIL,
    ITEM_BY_KEY,
    ITEM_KEYS,
    ITEMS,
    MISCONCEPTIONS,
    NOT_RECORDED,
    PASS,
    STATUSES,
    WARN,
    Checklist,
    ChecklistItem,
    Claim,
    Evidence,
    ItemResult,
    Misconception,
    MisconceptionNote,
    Verdict,
    worst,
)

__all__ = [
    "ADVERSARIAL_DIFFERENT",
    "CLAIM_STATUSES",
    "FAIL",
    "ITEMS",
    "ITEM_BY_KEY",
    "ITEM_KEYS",
    "MISCONCEPTIONS",
    "NOT_RECORDED",
    "PASS",
    "STATUSES",
    "WARN",
    "Checklist",
    "ChecklistItem",
    "Claim",
    "Evidence",
    "ItemResult",
    "Misconception",
    "MisconceptionNote",
    "Verdict",
    "agreement_summary",
    "build_checklist",
    "explanation_claims",
    "explanation_status",
    "parameter_table",
    "site_metric_table",
    "worst",
]
