"""The checklist's items, the misconceptions, and the result types (plain data).

The items, their wording and the misconceptions come from the source text "Attention
modules need targeted tests" (seed 003).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

PASS, WARN, FAIL, NOT_RECORDED = "pass", "warn", "fail", "not recorded"
STATUSES = (PASS, WARN, FAIL, NOT_RECORDED)
_SEVERITY = {NOT_RECORDED: -1, PASS: 0, WARN: 1, FAIL: 2}
# What a claim of the explanation verdict can be (attnaudit.checklist.claims): its interval
# on the claimed side of the threshold, on the other side, straddling it, or never measured.
SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTED = ("supported", "not supported",
                                                      "inconclusive", "not tested")
CLAIM_STATUSES = (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTED)


@dataclass(frozen=True)
class ChecklistItem:
    """One thing an attention audit should record (``title`` is the source's wording)."""

    key: str
    title: str


ITEMS: tuple[ChecklistItem, ...] = (
    ChecklistItem("qkv", "Query, key and value sources, shapes, projections and parameter "
                  "sharing"),
    ChecklistItem("scoring", "Score function, scale or temperature, normalisation dimension "
                  "and dropout placement"),
    ChecklistItem("eligibility", "Global, local, causal, padding and cross-source eligibility "
                  "rules"),
    ChecklistItem("masks", "Mask dtype, broadcast shape, fill value and all-masked-row "
                  "behaviour"),
    ChecklistItem("positions", "Source and target position conventions, truncation and cache "
                  "policy"),
    ChecklistItem("distributions", "Score ranges, entropy of weight distributions, masked "
                  "mass, non-finite values and output norms"),
    ChecklistItem("performance", "Latency, peak memory, valid-token throughput and "
                  "score-matrix materialisation"),
    ChecklistItem("interventions", "Intervention results supporting any claim that selected "
                  "positions explain an output"),
)
ITEM_KEYS = tuple(item.key for item in ITEMS)


@dataclass(frozen=True)
class Misconception:
    """A common misconception about attention and the source's correction of it."""

    key: str
    claim: str
    correction: str


MISCONCEPTIONS: tuple[Misconception, ...] = (
    Misconception("one_item", "Attention chooses exactly one source item.",
                  "Standard soft attention returns a weighted combination of eligible values."),
    Misconception("keys_are_values", "Keys and values must be identical.",
                  "Early models often reused states, but separate learned projections can "
                  "give them different roles."),
    Misconception("independent", "Attention weights are independent probabilities.",
                  "Softmax makes them compete through a shared denominator."),
    Misconception("scores_are_probabilities", "Scores are probabilities.",
                  "Scores are unnormalised compatibility values and can be negative or "
                  "arbitrarily scaled."),
    Misconception("larger_score", "A larger score always means a larger final contribution.",
                  "Masks, softmax competition, value magnitude, later projections, and other "
                  "paths also matter."),
    Misconception("mask_after_softmax", "Masking after softmax is equivalent to masking "
                  "before it.", "Post-softmax masking changes total mass unless weights are "
                  "renormalised."),
    Misconception("padding_vs_causal", "Padding masks and causal masks are interchangeable.",
                  "They encode different eligibility rules."),
    Misconception("sharp_is_correct", "A sharp distribution proves the model has found the "
                  "correct evidence.", "Concentration is a geometric property of one attention "
                  "operation."),
    Misconception("causal_explanation", "Attention weights are causal explanations.",
                  "They need intervention and output tests before supporting that claim."),
    Misconception("order", "Attention supplies order.",
                  "It operates on the representations and positional information it receives."),
    Misconception("global_better", "Global attention is always preferable.",
                  "It expands access and cost; local restrictions can be appropriate when "
                  "justified by the task."),
    Misconception("quadratic", "Attention removes quadratic cost in self-attention.",
                  "Full self-attention scores every query-key pair."),
    Misconception("all_masked_zero", "All-masked rows have zero attention by default.",
                  "Naive softmax can return undefined values for them."),
    Misconception("shape_proves_axis", "Matching output shape proves the correct softmax axis "
                  "was used.", "Normalising across the wrong dimension can preserve shape "
                  "while changing the model."),
)


@dataclass
class Evidence:
    """A tidy table backing an item; ``name`` becomes the CSV file name."""

    name: str
    title: str
    caption: str
    frame: pd.DataFrame


@dataclass
class ItemResult:
    """An item's outcome: status, one-line summary, method, observations, gaps, evidence."""

    item: ChecklistItem
    status: str
    summary: str
    measured: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    not_recorded: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.item.key

    @property
    def title(self) -> str:
        return self.item.title


@dataclass(frozen=True)
class Claim:
    """One claim of the explanation verdict: its answer (one of CLAIM_STATUSES) and the
    number it was read from with its bootstrap interval (NaN where it has none) and the
    threshold it was held against (NaN for none); examples: what the interval is over."""

    key: str
    question: str
    status: str
    answer: str
    estimate: float
    low: float
    high: float
    threshold: float
    examples: int


CLAIM_COLUMNS = ["claim", "question", "status", "answer", "estimate", "estimate_low",
                 "estimate_high", "threshold", "examples"]


@dataclass
class Verdict:
    key: str
    question: str
    status: str
    answer: str
    reasons: list[str]
    claims: list[Claim] = field(default_factory=list)


@dataclass
class MisconceptionNote:
    """A misconception, its correction and what this audit measured on it. names: the
    list the evidence sentence stands for (e.g. every site with separate key and value
    tensors), which the page summarises with the full list one click away."""

    claim: str
    correction: str
    evidence: str
    names: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The evidence with its whole list, as the misconceptions table holds it."""
        return f"{self.evidence}: {'; '.join(self.names)}." if self.names else self.evidence


@dataclass
class Checklist:
    items: list[ItemResult]
    verdicts: list[Verdict]
    misconceptions: list[MisconceptionNote]

    def item(self, key: str) -> ItemResult:
        for result in self.items:
            if result.key == key:
                return result
        raise KeyError(f"no checklist item {key!r}; items are {', '.join(ITEM_KEYS)}")

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every evidence table by name (names are unique across items)."""
        out: dict[str, pd.DataFrame] = {}
        for result in self.items:
            for ev in result.evidence:
                if ev.name in out:
                    raise ValueError(f"evidence table {ev.name!r} appears twice")
                out[ev.name] = ev.frame
        return out

    def summary_frame(self) -> pd.DataFrame:
        """One row per item: key, title, status, summary."""
        return pd.DataFrame([{"item": r.key, "title": r.title, "status": r.status,
                              "summary": r.summary} for r in self.items])

    def summary_tables(self) -> dict[str, pd.DataFrame]:
        """``verdicts`` (verdict, question, status, answer), ``claims`` (the explanation
        verdict's claims, :data:`CLAIM_COLUMNS`), ``checklist`` (one row per item) and
        ``misconceptions`` (misconception, correction, evidence)."""
        verdicts = pd.DataFrame([{"verdict": v.key, "question": v.question,
                                  "status": v.status, "answer": v.answer}
                                 for v in self.verdicts])
        notes = pd.DataFrame([{"misconception": n.claim, "correction": n.correction,
                               "evidence": n.evidence} for n in self.misconceptions],
                             columns=["misconception", "correction", "evidence"])
        claims = pd.DataFrame([[c.key, c.question, c.status, c.answer, c.estimate, c.low,
                                c.high, c.threshold, c.examples]
                               for v in self.verdicts for c in v.claims],
                              columns=CLAIM_COLUMNS)
        return {"verdicts": verdicts, "claims": claims, "checklist": self.summary_frame(),
                "misconceptions": notes}

    def all_tables(self) -> dict[str, pd.DataFrame]:
        """Every table of the audit by CSV name: the summaries, then every evidence table."""
        return {**self.summary_tables(), **self.tables()}


def worst(statuses: Iterable[str]) -> str:
    """The most severe status; ``not recorded`` when there is none."""
    found = [s for s in statuses if s != NOT_RECORDED]
    if not found:
        return NOT_RECORDED
    for status in found:
        if status not in _SEVERITY:
            raise ValueError(f"unknown status {status!r}; expected one of {STATUSES}")
    return max(found, key=_SEVERITY.__getitem__)


def missing_item(item: ChecklistItem, reason: str) -> ItemResult:
    return ItemResult(item, NOT_RECORDED, f"Not recorded: {reason}",
                      not_recorded=[reason])


ITEM_BY_KEY = {item.key: item for item in ITEMS}
