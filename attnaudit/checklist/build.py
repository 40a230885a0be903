"""The whole checklist: validity items, the intervention item, verdicts, misconceptions."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from attnaudit.checklist.evidence_tables import metric_mean, metric_range, parameter_table
from attnaudit.checklist.explanation import (
    SuiteTables,
    explanation_verdict,
    intervention_lines,
    interventions_item,
)
from attnaudit.checklist.items import (
    FAIL,
    ITEM_BY_KEY,
    ITEMS,
    MISCONCEPTIONS,
    PASS,
    Checklist,
    MisconceptionNote,
    Verdict,
    missing_item,
    worst,
)
from attnaudit.checklist.performance import performance_item
from attnaudit.checklist.retrieval import (
    distributions_item,
    eligibility_item,
    masks_item,
    positions_item,
    qkv_item,
    scoring_item,
    validity_verdict,
)
from attnaudit.record import Role
from attnaudit.validity.findings import Finding
from attnaudit.validity.result import ValidityAudit


def build_checklist(model: nn.Module, audit: ValidityAudit | None, suite: SuiteTables | None, *,
                    audit_reason: str | None = None,
                    suite_reason: str | None = None) -> Checklist:
    """Map a validity audit and an intervention suite onto the checklist.

    Args:
        model: the audited model (its parameters and modules are inspected, not run).
        audit: a :class:`attnaudit.validity.result.ValidityAudit`, or None when not run.
        suite: an intervention suite's tables and metadata, or None when not run.
        audit_reason, suite_reason: why a part is missing; shown as "not recorded".
    """
    no_audit = audit_reason or "the validity audit was not run"
    no_suite = suite_reason or "the intervention suite was not run"
    if audit is None:
        items = [missing_item(item, no_audit) for item in ITEMS if item.key != "interventions"]
        findings: list[Finding] = []
    else:
        findings = audit.findings()
        items = [qkv_item(model, audit), scoring_item(model, audit, findings),
                 eligibility_item(audit, findings), masks_item(audit, findings),
                 positions_item(model, audit), distributions_item(audit, findings),
                 performance_item(audit)]
    items.append(missing_item(ITEM_BY_KEY["interventions"], no_suite) if suite is None
                 else interventions_item(suite))
    validity = validity_verdict(findings, no_audit if audit is None else None)
    explanation = explanation_verdict(items[-1], suite, validity)
    return Checklist(items, [validity, explanation],
                     _misconception_notes(model, audit, findings, suite, explanation))


def _misconception_notes(model: nn.Module, audit: ValidityAudit | None,
                         findings: Sequence[Finding], suite: SuiteTables | None,
                         explanation: Verdict) -> list[MisconceptionNote]:
    """The misconceptions something measured here bears on, with what was measured; the
    note on "attention weights are causal explanations" opens with the explanation
    verdict, so that the two say the same."""
    notes: dict[str, str] = {}
    names: dict[str, tuple[str, ...]] = {}
    by_check: dict[str, list[Finding]] = {}
    for f in findings:
        by_check.setdefault(f.check, []).append(f)

    def checked(check: str) -> str | None:
        group = by_check.get(check)
        return None if not group else worst(f.status for f in group)

    if audit is not None:
        keys = metric_mean(audit.metrics, "effective_keys")
        top = metric_mean(audit.metrics, "max_weight")
        if keys is not None and top is not None:
            notes["one_item"] = (f"Mean effective number of keys exp(H) = {keys:.3g} and mean "
                                 f"largest weight {top:.3g}: each row mixes "
                                 f"{'several keys' if keys > 1.05 else 'almost one key'}.")
        row_sums = _row_sum_note(audit, by_check.get("row_sum", []), findings)
        if row_sums:
            notes["independent"] = row_sums
        scores = metric_range(audit.metrics, "score_min", "score_max")
        if scores is not None:
            notes["scores_are_probabilities"] = (
                f"Pre-softmax scores on eligible keys range from {scores[0]:.3g} to "
                f"{scores[1]:.3g}.")
        masked = checked("masked_mass")
        if masked is not None:
            notes["mask_after_softmax"] = (
                "No counted row puts weight on an ineligible key." if masked == PASS else
                "Some rows put weight on ineligible keys: masking leaks mass (see the "
                "eligibility section).")
        roles = set("/".join(audit.sites["role"]).split("/"))
        if Role.DECODER_SELF in roles:
            notes["padding_vs_causal"] = ("Decoder self-attention was checked against the "
                                          "causal rule, source attention against padding.")
        if roles & {Role.ENCODER_SELF, Role.DECODER_SELF}:
            notes["quadratic"] = ("Self-attention sites form a full queries x keys weight "
                                  "matrix per head (see the sites table for their sizes).")
        all_masked = int(audit.site_summary["all_masked_rows"].sum())
        if all_masked:
            behaviour = "; ".join(f"{s.site}: {s.all_masked_behaviour}"
                                  for s in audit.site_summary.itertuples(index=False)
                                  if s.all_masked_rows)
            notes["all_masked_zero"] = f"{all_masked} all-masked row(s): {behaviour}."
        axis = checked("softmax_axis")
        if axis is not None:
            notes["shape_proves_axis"] = (
                "Rows were checked to sum to one over the key axis, not just for shape: "
                + ("none was normalised over the query axis." if axis == PASS else
                   "some look normalised over the query axis."))
        separate = separate_key_value(model, audit)
        if separate:
            notes["keys_are_values"] = ("Separate key and value projection tensors at "
                                        f"{len(separate)} site(s)")
            names["keys_are_values"] = tuple(separate)
    if suite is not None:
        notes["causal_explanation"] = (f"Explanation verdict: {explanation.status} — "
                                       f"{explanation.answer}")
        for line, key in intervention_lines(dict(suite.tables), suite.protocols):
            if key:
                notes[key] = f"{notes[key]} {line}" if key in notes else line
    return [MisconceptionNote(m.claim, m.correction, notes[m.key], names.get(m.key, ()))
            for m in MISCONCEPTIONS if m.key in notes]


def _row_sum_note(audit: ValidityAudit, row_sum: Sequence[Finding],
                  findings: Sequence[Finding]) -> str:
    """What the row-sum check found, as evidence on "weights are independent probabilities";
    a unit sum is claimed only where every counted row has one and the audit passes
    validity. Empty when the check did not run."""
    if not row_sum:
        return ""
    rows = int(audit.site_summary["rows"].sum())
    if worst(f.status for f in row_sum) != PASS:
        off = sum(f.rows for f in row_sum if f.status != PASS)
        largest = float(audit.site_summary["row_sum_error_max"].max())
        return (f"{off} of {rows} counted rows do not sum to one over their keys (largest "
                f"|sum - 1| = {largest:.3g}; row_sum check: "
                f"{worst(f.status for f in row_sum)}): these weights are not a softmax "
                "distribution, so they do not compete through one shared denominator.")
    failing = sorted({f"{f.check} at {f.site}" for f in findings if f.status == FAIL})
    if failing:
        return (f"The {rows} counted rows sum to one over all their keys (row_sum check "
                f"passes), but the computation fails validity ({'; '.join(failing)}): "
                "the shared denominator also covers weights the model should not use.")
    return (f"Every one of the {rows} counted rows sums to one over its keys (row_sum check "
            "passes), so weights trade off against each other.")


def separate_key_value(model: nn.Module, audit: ValidityAudit) -> list[str]:
    """Each site whose module has distinct key and value projection tensors, as
    ``"site (key tensor, value tensor)"``, by site name."""
    params = parameter_table(model, dict(zip(audit.sites["site"], audit.sites["module"],
                                             strict=True)))
    found = []
    for site, part in params.groupby("site", sort=True):
        names = part["parameter"].tolist()
        key = [n for n in names if n.endswith(("k_proj.weight", "key.weight"))]
        value = [n for n in names if n.endswith(("v_proj.weight", "value.weight"))]
        if key and value:
            found.append(f"{site} ({key[0]}, {value[0]})")
    return found
