"""The intervention item and the verdict on explanatory claims, from the suite's tables.

The item's sentences come from the protocols the suite ran
(:class:`~attnaudit.interventions.protocol.InterventionProtocol`, each reading its own tables
by name); the status from the per-row table ``rows`` and the ``adversarial`` table, with the
thresholds below (docs/metrics.md, "Explanation status").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pandas as pd

from attnaudit.checklist.contributions import CONTRIBUTION_TABLES, contribution_lines
from attnaudit.checklist.items import (
    FAIL,
    ITEM_BY_KEY,
    NOT_RECORDED,
    PASS,
    WARN,
    Evidence,
    ItemResult,
    Verdict,
)
from attnaudit.interventions.permutation import SMALL_TVD
from attnaudit.interventions.protocol import ROWS, InterventionProtocol, rate, table_with
from attnaudit.interventions.registry import registered_protocols

# docs/metrics.md, "Explanation status": pass needs fewer than this share of rows whose
# median permutation TVD is below SMALL_TVD ...
SENSITIVE_BELOW = 0.5
# ... fail needs at least this share of them, and uniform weights flipping the argmax in
# fewer than FEW_FLIPS of the rows.
INSENSITIVE_FROM = 0.9
FEW_FLIPS = 0.05
# Mean eps-max JSD (of at most ln 2) from which the adversarial search counts as having
# found very different weights with the same output: the weights are then not the only
# allocation the output supports, so they cannot pass as its explanation.
ADVERSARIAL_DIFFERENT = 0.1


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
                     f"on {len(metadata.get('cumulative_examples', []))} seeded examples; "
                     f"adversarial search on {len(metadata.get('adversarial_examples', []))} "
                     f"seeded examples; attributions: "
                     f"{', '.join(metadata.get('attribution_methods', []))}"
                     f"{' (--quick)' if metadata.get('quick') else ''}.")
    if "protocols" in metadata:
        lines.append(f"Protocols run: {', '.join(metadata['protocols'])}.")
    for method, variant in metadata.get("attribution_variants", {}).items():
        lines.append(f"Attribution {method}: {variant}.")
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
    """pass: outputs depend on which keys the weights select (fewer than
    ``SENSITIVE_BELOW`` of the rows keep a median permutation TVD below ``SMALL_TVD``,
    zeroing the top key flips more often than a random one) and, when the adversarial search
    ran, it found no very different weights (mean eps-max JSD below
    ``ADVERSARIAL_DIFFERENT``) that keep the output; fail: at least ``INSENSITIVE_FROM`` of
    the rows are that insensitive and uniform weights flip fewer than ``FEW_FLIPS`` of them;
    warn: in between or no permutation result in ``rows``; not recorded: no table."""
    if not tables:
        return NOT_RECORDED
    rows = table_with(tables, ROWS, "perm_median_tvd")
    if rows is None:
        return WARN
    insensitive = float((rows["perm_median_tvd"] < SMALL_TVD).mean())
    top_matters = "zero_top_flip" not in rows or (
        rate(rows["zero_top_flip"]) > rate(rows["zero_random_flip"]))
    uniform_flips = rate(rows["uniform_flip"]) if "uniform_flip" in rows else 1.0
    adversarial = table_with(tables, "adversarial", "eps_max_jsd")
    unique = adversarial is None or (
        float(adversarial["eps_max_jsd"].mean()) < ADVERSARIAL_DIFFERENT)
    if insensitive < SENSITIVE_BELOW and top_matters and unique:
        return PASS
    if insensitive >= INSENSITIVE_FROM and uniform_flips < FEW_FLIPS:
        return FAIL
    return WARN


def explanation_verdict(item: ItemResult, suite: SuiteTables | None, validity: Verdict
                        ) -> Verdict:
    """The verdict on explanatory claims: from the intervention item, unless the attention
    fails validity, where no intervention on its weights can support such a claim."""
    question = "Support for explanatory claims"
    if validity.status == FAIL:
        return Verdict("explanation", question, FAIL,
                       "Not meaningful: the attention fails the validity checks, so its "
                       "weights are not a valid weighted retrieval and no intervention on "
                       "them can support a claim that they explain an output.",
                       [f"Validity: {validity.answer}", *validity.reasons[:5],
                        *item.observations])
    if suite is None:
        return Verdict("explanation", question, NOT_RECORDED,
                       "Not recorded: no intervention results, so the weights support no "
                       "claim that selected positions explain an output.", item.not_recorded)
    answers = {
        PASS: "Interventions on the weights change the outputs in the way an explanation "
              "needs; claims still hold only for the rows and interventions tested.",
        WARN: "Limited: the interventions give mixed support; read the weights as a record "
              "of the retrieval, not as an explanation of the output.",
        FAIL: "Not supported: the outputs barely depend on which positions the weights "
              "select.",
        NOT_RECORDED: "Not recorded: the suite produced no usable table.",
    }
    return Verdict("explanation", question, item.status, answers[item.status],
                   item.observations)
