"""The intervention item and the verdict on explanatory claims, from the suite's tables.

The item's sentences come from the protocols the suite ran
(:class:`~attnaudit.interventions.protocol.InterventionProtocol`, each reading its own tables
by name); the status and the verdict from the claims of :mod:`attnaudit.checklist.claims`
(docs/metrics.md, "Explanation status").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pandas as pd

from attnaudit.checklist.claims import explanation_claims, item_status
from attnaudit.checklist.contributions import CONTRIBUTION_TABLES, contribution_lines
from attnaudit.checklist.items import (
    FAIL,
    ITEM_BY_KEY,
    NOT_SUPPORTED,
    NOT_TESTED,
    Claim,
    Evidence,
    ItemResult,
    Verdict,
)
from attnaudit.interventions.protocol import InterventionProtocol, table_with
from attnaudit.interventions.registry import registered_protocols


class SuiteTables(Protocol):
    """What the checklist reads of an intervention suite
    (:class:`attnaudit.auditing.intervention_suite.InterventionSuite`)."""

    @property
    def tables(self) -> Mapping[str, pd.DataFrame]:
        """The suite's tables by name (docs/metrics.md columns)."""
        ...

    @property
    def metadata(self) -> Mapping[str, Any]:
        """What was run on what: variant, edited sites, subsets, attribution methods..."""
        ...

    @property
    def protocols(self) -> Sequence[InterventionProtocol]:
        """The registered protocols the suite ran with (their checklist lines)."""
        ...


def interventions_item(suite: SuiteTables) -> ItemResult:
    """The intervention item: every suite table as evidence, each protocol's sentences, the
    status from :func:`explanation_status`."""
    tables = dict(suite.tables)
    evidence = [Evidence(name, name.replace("_", " ").capitalize(),
                         "From the intervention suite (docs/metrics.md protocols).", frame)
                for name, frame in tables.items() if name not in CONTRIBUTION_TABLES]
    observations = [line for line, _ in intervention_lines(tables, suite.protocols)]
    return ItemResult(
        ITEM_BY_KEY["interventions"], explanation_status(tables),
        "Weights, values and inputs were intervened on and the output distribution compared.",
        measured=["Teacher-forced on the model's own decoded output; each intervention edits "
                  "the attention inside the forward pass and compares the per-step output "
                  "distribution with the unedited one (TVD, JSD, argmax flips).",
                  "Status: the explanation verdict's headline claim (supported: pass, "
                  "inconclusive: warn, not supported: fail, not tested: not recorded), each "
                  "claim read from its number's 95 % bootstrap interval over examples "
                  "against a threshold (docs/metrics.md, \"Explanation status\"); a "
                  "criterion that did not run is not tested and never counts as met.",
                  *_suite_settings(suite.metadata)],
        observations=observations,
        evidence=evidence,
    )


def _suite_settings(metadata: Mapping[str, Any]) -> list[str]:
    """The suite's variant and subsets, as lines for the report."""
    lines = []
    if "protocol" in metadata:
        lines.append(f"Variant: {metadata['protocol']}; attention = {metadata['attention']}.")
    if "n_permutations" in metadata:
        lines.append(f"Edited sites: {', '.join(map(str, metadata.get('sites', [])))}; "
                     f"{metadata['n_permutations']} permutations per row; cumulative removal "
                     f"on {len(metadata.get('cumulative_examples', []))} seeded examples"
                     + (f" ({metadata['cumulative_random_draws']} random orders per row)"
                        if "cumulative_random_draws" in metadata else "") + "; "
                     f"adversarial search on {len(metadata.get('adversarial_examples', []))} "
                     f"seeded examples; attributions: "
                     f"{', '.join(metadata.get('attribution_methods', []))}"
                     f"{' (--quick)' if metadata.get('quick') else ''}.")
    if "protocols" in metadata:
        lines.append(f"Protocols run: {', '.join(metadata['protocols'])}.")
    if "bootstrap" in metadata:
        boot = metadata["bootstrap"]
        lines.append(f"Intervals: {boot['level']:.0%} {boot['interval']}, resampling "
                     f"{boot['unit']}s: {boot['resamples']} resamples, seed {boot['seed']}.")
    for method, variant in metadata.get("attribution_variants", {}).items():
        lines.append(f"Attribution {method}: {variant}.")
    if metadata.get("adversarial_steps", "not run") != "not run":
        lines.append(f"Adversarial search: {metadata['adversarial_steps']}.")
    if "faithfulness_budget" in metadata:
        lines.append(f"Faithfulness rows measured: {metadata['faithfulness_rows_measured']}; "
                     f"budget: {metadata['faithfulness_budget']}.")
    if "leave_one_out_window" in metadata:
        lines.append(f"Leave-one-out, eligible keys replaced per edit: "
                     f"{metadata['leave_one_out_window']}.")
    if "degenerate_rows" in metadata:
        counts = ", ".join(f"{n} {reason}" for reason, n in metadata["degenerate_rows"].items())
        lines.append(f"Degenerate rows, left out of every per-row protocol and listed in the "
                     f"degenerate table: {counts} (empty output: end of sequence at step 0; "
                     "no eligible key: only padding and special tokens; one eligible key: no "
                     "other weighting exists; negligible view mass: the edited prompt views "
                     "held almost none of the row).")
    return lines


def agreement_summary(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """The ``agreement_summary`` table (method_a, method_b, kendall_tau_mean, ...) with a
    ``pair`` label column, or None when the suite has none."""
    found = table_with(tables, "agreement_summary", "kendall_tau_mean")
    if found is None:
        return None
    return found.assign(pair=found["method_a"].astype(str) + " vs "
                        + found["method_b"].astype(str))


def intervention_lines(tables: Mapping[str, pd.DataFrame],
                       protocols: Sequence[InterventionProtocol] | None = None
                       ) -> list[tuple[str, str]]:
    """(sentence, misconception key or "") of every protocol (default: every registered
    one) whose tables are there, then the contribution lines."""
    protocols = registered_protocols() if protocols is None else protocols
    lines = [line for protocol in protocols for line in protocol.checklist_lines(tables)]
    return lines + contribution_lines(tables)


def explanation_status(tables: Mapping[str, pd.DataFrame]) -> str:
    """The intervention item's status: the headline claim's
    (:func:`attnaudit.checklist.claims.headline`) as a checklist status — supported: pass,
    inconclusive: warn, not supported: fail, not tested: not recorded."""
    return item_status(explanation_claims(tables)[0].status)


def _claim_line(claim: Claim) -> str:
    return f"{claim.question} — {claim.status}: {claim.answer}"


def explanation_verdict(item: ItemResult, suite: SuiteTables | None, validity: Verdict
                        ) -> Verdict:
    """The verdict on explanatory claims: the headline claim's status (supported, not
    supported, inconclusive, not tested) with every claim as a reason, unless the attention
    fails validity, where no intervention on its weights can support such a claim (not
    supported)."""
    question = "Support for explanatory claims"
    if validity.status == FAIL:
        return Verdict("explanation", question, NOT_SUPPORTED,
                       "Not meaningful: the attention fails the validity checks, so its "
                       "weights are not a valid weighted retrieval and no intervention on "
                       "them can support a claim that they explain an output.",
                       [f"Validity: {validity.answer}", *validity.reasons[:5],
                        *item.observations])
    if suite is None:
        return Verdict("explanation", question, NOT_TESTED,
                       "Not tested: no intervention results, so the weights support no "
                       "claim that selected positions explain an output.", item.not_recorded)
    claims = explanation_claims(dict(suite.tables))
    top = claims[0]  # the HEADLINE claim
    return Verdict("explanation", question, top.status, f"{top.question}: {top.answer}",
                   [_claim_line(c) for c in claims[1:]], claims)


def claims_record(verdict: Verdict) -> dict[str, Any]:
    """The explanation verdict for the manifest: its status and each claim's status, number
    and interval (None where NaN: JSON has no NaN)."""
    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"status": verdict.status,
            "claims": {c.key: {"status": c.status, "estimate": number(c.estimate),
                               "low": number(c.low), "high": number(c.high),
                               "threshold": number(c.threshold), "examples": c.examples}
                       for c in verdict.claims}}
