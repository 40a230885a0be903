"""The checklist's items on the retrieval computation, and the verdict on its validity.

One function per item (query/key/value sources, scoring, eligibility, masks, positions,
distributions), each returning an :class:`~attnaudit.checklist.items.ItemResult` with its
evidence tables, read off a :class:`~attnaudit.validity.result.ValidityAudit` and its
findings; :func:`validity_verdict` answers whether the attention is a valid weighted
retrieval computation. The performance item is in :mod:`attnaudit.checklist.performance`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from torch import nn

from attnaudit.analysis.cached_decoding import CachedDecoding
from attnaudit.analysis.words import word_attention_table
from attnaudit.checklist.evidence_tables import dropout_table, parameter_table, site_metric_table
from attnaudit.checklist.items import (
    FAIL,
    ITEM_BY_KEY,
    NOT_RECORDED,
    PASS,
    WARN,
    Evidence,
    ItemResult,
    Verdict,
    worst,
)
from attnaudit.record import Role
from attnaudit.targets.checks import config_position_limit
from attnaudit.validity.findings import Finding, describe_tolerance, findings_frame
from attnaudit.validity.result import ValidityAudit


def _findings_for(findings: Sequence[Finding], checks: Sequence[str]) -> list[Finding]:
    return [f for f in findings if f.check in checks]


def _findings_evidence(name: str, title: str, findings: Sequence[Finding]) -> Evidence:
    return Evidence(name, title, "Per site and check; rows = failing (example, head, query "
                    "step) rows.", findings_frame(findings))


def _finding_lines(findings: Sequence[Finding]) -> list[str]:
    """One line per finding that does not pass; one line for all those that do."""
    lines = [f"{f.site}, {f.check}: {f.status} ({f.detail})" for f in findings
             if f.status != PASS]
    passed = [f for f in findings if f.status == PASS]
    if passed:
        checks = ", ".join(sorted({f.check for f in passed}))
        lines.append(f"{len(passed)} check(s) pass ({checks}) at "
                     f"{len({f.site for f in passed})} site(s); details in the table below.")
    return lines


SITE_MODULES_CAPTION = ("One row per attention site, as capture saw it: mechanism, module, "
                        "the model's own layout of the weights and how capture determined it "
                        "(call: the tensor or call says it; stated: by the user; inferred: "
                        "from head-count or batch-size names at the call site; default: "
                        "nothing said anything, so the leading axis is read as the batch), "
                        "heads, largest query and key counts, and the role (cross, encoder "
                        "or decoder self-attention) its shape matched.")


def qkv_item(model: nn.Module, audit: ValidityAudit) -> ItemResult:
    """Query, key and value sources: the sites capture found, their shapes and roles, and
    the parameters of their modules."""
    sites = audit.sites
    params = parameter_table(model, dict(zip(sites["site"], sites["module"], strict=True)))
    unmatched = sites.loc[sites["role"].str.contains(Role.CAPTURED), "site"].tolist()
    shared = params[params["shared_with"] != ""]
    observations = [
        f"{s.site}: {s.mechanism} attention in module {s.module or '(root)'}, laid out as "
        f"({s.layout}) ({s.layout_source}), {s.heads} "
        f"head(s), up to {s.queries} queries x {s.keys} keys, role {s.role}; values "
        f"{'captured' if s.values_available else 'not reachable through capture'}."
        for s in sites.itertuples(index=False)]
    if shared.empty:
        observations.append("No parameter of an attention module shares its tensor with "
                            "another parameter.")
    else:
        observations.extend(f"{r.parameter} shares its tensor with {r.shared_with}."
                            for r in shared.itertuples(index=False))
    if unmatched:
        observations.append(f"Shape matched no source/target length (keys are not known to "
                            f"be source positions): {', '.join(unmatched)}.")
    return ItemResult(
        ITEM_BY_KEY["qkv"], WARN if unmatched else PASS,
        (f"{len(sites)} site(s) captured; query/key shapes "
         f"{'match' if not unmatched else 'do not all match'} the emitted steps and source "
         "positions of the audited data."),
        measured=[
            "Weights were captured as (batch, heads, queries, keys) at every site during the "
            "teacher-forced forward; their query and key counts were compared with the "
            "number of emitted steps and source positions of each batch.",
            "Parameters of each site's module were listed with their shapes; parameter "
            "sharing was read from tensor identity (named_parameters without removing "
            "duplicates).",
        ],
        observations=observations,
        not_recorded=["Which tensors feed the queries, keys and values (e.g. keys = a "
                      "projection of encoder states, values = the states themselves) is not "
                      "visible from parameters alone; it is the model's code. For a site "
                      "computed in the root module, the listed parameters are the whole "
                      "model's."],
        evidence=[Evidence("sites", "Attention sites", SITE_MODULES_CAPTION, sites),
                  Evidence("parameters", "Parameters of the attention modules",
                           "shared_with lists other names of the same tensor.", params)],
    )


def scoring_item(model: nn.Module, audit: ValidityAudit, findings: Sequence[Finding]
                 ) -> ItemResult:
    """Scoring and normalisation: row sums, the softmax axis, score ranges and dropout."""
    checks = _findings_for(findings, ("row_sum", "softmax_axis"))
    scores = site_metric_table(audit.metrics, ("score_min", "score_max", "score_mean"))
    dropout = dropout_table(model, dict(zip(audit.sites["site"], audit.sites["module"],
                                             strict=True)))
    mechanisms = ", ".join(f"{s} ({m})" for s, m in zip(audit.sites["site"],
                                                         audit.sites["mechanism"], strict=True))
    observations = [f"Mechanism per site: {mechanisms}."]
    if model.training:
        observations.append("The model was in training mode: dropout, if any, was active "
                            "during the audit.")
    elif not dropout.empty:
        observations.append(f"{len(dropout)} dropout setting(s) inside attention modules; "
                            "the model was in eval mode, so none was active during the audit.")
    else:
        observations.append("No dropout module or dropout rate inside the attention modules.")
    evidence = [_findings_evidence("normalisation_findings", "Normalisation checks", checks)]
    if not scores.empty:
        evidence.append(Evidence("score_ranges", "Pre-softmax score ranges",
                                 "Over eligible keys, per site and head, all steps.", scores))
    if not dropout.empty:
        evidence.append(Evidence("dropout", "Dropout inside attention modules",
                                 "training = the module's mode during the audit.", dropout))
    return ItemResult(
        ITEM_BY_KEY["scoring"], worst(f.status for f in checks),
        "Normalisation axis and row sums checked at every site; score function and scale "
        "are read from the mechanism only.",
        measured=["Each row's sum over the key axis was compared with 1 (row_sum_error, "
                  f"tolerance {describe_tolerance(audit.row_sum_tolerance)}); an (example, "
                  "head) whose rows do not sum to one while its columns do is flagged as a "
                  "softmax over the wrong axis.",
                  "Pre-softmax scores were captured where the mechanism exposes them and "
                  "their range over eligible keys recorded."],
        observations=observations + _finding_lines(checks),
        not_recorded=["The score function (additive, dot product, bilinear) and any scale or "
                      "temperature are properties of the model's code; attnaudit records the "
                      "mechanism that computed the softmax, not the formula."],
        evidence=evidence,
    )


def eligibility_item(audit: ValidityAudit, findings: Sequence[Finding]) -> ItemResult:
    """Key eligibility: the rule declared per site and the mass on ineligible keys."""
    checks = _findings_for(findings, ("eligibility", "masked_mass"))
    rules = audit.sites[["site", "kind", "role", "eligibility", "key_mask_shape"]]
    return ItemResult(
        ITEM_BY_KEY["eligibility"], worst(f.status for f in checks),
        "Key eligibility was declared from the target (padding for source keys, causal for "
        "decoder self-attention) and weight on ineligible keys measured.",
        measured=["Cross-attention and encoder self-attention: real (non-padding) source "
                  "tokens are eligible; decoder self-attention: keys at or before the query "
                  "step; any other shape: the mask the model itself applied. The declared "
                  "rule is combined with the model's own mask.",
                  f"masked_mass (weight on ineligible keys) per row, tolerance "
                  f"{audit.max_masked_mass:g}; rows after the first end-of-sequence step are "
                  "not counted."],
        observations=_finding_lines(checks),
        not_recorded=["Local windows and other model-specific restrictions are only seen "
                      "through the model's own mask; they are not declared by the target."],
        evidence=[Evidence("eligibility_rules", "Eligibility rule per site",
                           "The rule masked mass was measured against.", rules),
                  _findings_evidence("eligibility_findings", "Eligibility checks", checks)],
    )


def masks_item(audit: ValidityAudit, findings: Sequence[Finding]) -> ItemResult:
    """Masks: broadcast shape, fill value and what rows with every key masked produce."""
    checks = _findings_for(findings, ("all_masked_nan",))
    summary = audit.site_summary[["site", "all_masked_rows", "all_masked_nan",
                                  "all_masked_zeros", "all_masked_uniform",
                                  "all_masked_behaviour"]]
    masks = audit.sites[["site", "mechanism", "key_mask_shape"]].merge(
        audit.site_summary[["site", "mask_fill"]], on="site", how="left")
    fills = site_metric_table(audit.metrics, ("masked_score_min", "masked_score_max",
                                              "masked_score_non_finite"))
    seen = int(summary["all_masked_rows"].sum())
    observations = [f"{s.site}: key mask shape {s.key_mask_shape}, fill value "
                    f"{s.mask_fill or 'not seen (no masked key, or scores unavailable)'}."
                    for s in masks.itertuples(index=False)]
    observations.append(f"{seen} row(s) with every key masked were seen." if seen else
                        "No row with every key masked occurred in the audited data, so the "
                        "all-masked behaviour was not exercised.")
    evidence = [Evidence("mask_conventions", "Mask shape and fill per site",
                         "Fill = the pre-softmax scores seen at masked keys (-inf, the "
                         "largest finite one, or both).", masks),
                Evidence("all_masked_rows", "Rows with every key masked",
                         "What the model produced on them.", summary)]
    if not fills.empty:
        evidence.append(Evidence("masked_scores", "Scores at masked keys",
                                 "Finite fills appear in min/max; -inf fills are counted as "
                                 "masked_score_non_finite.", fills))
    return ItemResult(
        ITEM_BY_KEY["masks"], worst(f.status for f in checks),
        "Mask broadcast shape and fill value read from the captured calls; all-masked rows "
        "checked for NaN.",
        measured=["The key mask capture derived for each call (from mask arguments or from "
                  "scores filled with very negative values) gives the broadcast shape; the "
                  "largest pre-softmax score at a masked key gives the fill value.",
                  "Rows with no eligible key are classified by what the model produced: "
                  "NaN, zeros or uniform."],
        observations=observations + _finding_lines(checks),
        not_recorded=["The dtype of the mask the model passes (bool or additive float) is "
                      "not kept: capture normalises every mask to bool."],
        evidence=evidence,
    )


def positions_item(model: nn.Module, audit: ValidityAudit) -> ItemResult:
    """Positions: not measured; the protocol, the lengths seen and any truncation; a warning
    when the model's own cached decoding steps differ from its one teacher-forced pass
    (the weights shown are then not the ones its generate() computed)."""
    observations = [f"{s.site}: up to {s.queries} query steps and {s.keys} keys per batch."
                    for s in audit.sites.itertuples(index=False)]
    limit = config_position_limit(getattr(model, "config", None))
    if limit is not None:
        longest = int(audit.sites["keys"].max())
        observations.append(f"The model's config allows {limit} positions; the longest "
                            f"captured key axis was {longest}.")
    truncation = audit.truncation
    if truncation:
        observations.append(f"Source truncation: {truncation}.")
    if audit.decoding:
        observations.append(f"Decoding: {audit.decoding}.")
    cached = audit.cached_decoding
    observations.append(cached.sentence())
    measured = ["Protocol: the target's decoding (greedy, or the hypothesis the model's "
                "own generation settings return, as the Decoding observation says), then "
                "that output teacher-forced in one forward pass (for Hugging Face targets "
                "without the key/value cache); captured query rows are emitted steps, keys "
                "are source positions."]
    evidence = []
    if cached.measured:
        measured.append("Cached decoding: the same output decoded again by the model's own "
                        "generate(), forced along it one step at a time from its cache, and each "
                        "step's output distribution compared with the teacher-forced "
                        "pass's (total variation per emitted step; tolerance "
                        f"{cached.tolerance:g} for the logits' dtype).")
        evidence.append(Evidence("cached_decoding", "Cached decoding against the "
                                 "teacher-forced pass",
                                 "rows: emitted steps compared; differing_rows: beyond the "
                                 "tolerance; total_variation, example, step: the largest "
                                 "and its row.", cached.frame()))
    unseen = ["how source and target positions are numbered"]
    if not truncation:
        unseen.append("whether inputs were truncated by a tokenizer")
    if not cached.measured:
        unseen.append("whether a cache changes the computation")
    phrase = unseen[0] if len(unseen) == 1 else f"{', '.join(unseen[:-1])} and {unseen[-1]}"
    verb = "is" if len(unseen) == 1 else "are"
    return ItemResult(
        ITEM_BY_KEY["positions"], WARN if cached.differs else NOT_RECORDED,
        _positions_summary(cached), measured=measured, observations=observations,
        not_recorded=[f"{phrase[0].upper()}{phrase[1:]} {verb} not inspected."],
        evidence=evidence,
    )


def _positions_summary(cached: CachedDecoding) -> str:
    """The positions item's one line: what was not measured, and the cached decoding."""
    if not cached.measured:
        return ("Position conventions, truncation and cache policy are not measured "
                "automatically; the audit protocol and the lengths seen are listed.")
    if cached.differs:
        return ("The model's own cached decoding steps differ from its teacher-forced pass: "
                "the weights shown are the one pass's, not those its generate() computed. "
                "Position conventions and truncation are not measured automatically.")
    return ("Position conventions and truncation are not measured automatically; the "
            "model's own cached decoding steps agree with its teacher-forced pass.")


DISTRIBUTION_METRICS = ("entropy", "entropy_norm", "effective_keys", "kl_to_uniform",
                        "max_weight", "n_valid", "masked_mass", "non_finite", "negative",
                        "row_sum_error", "score_min", "score_max", "output_norm")


def distributions_item(audit: ValidityAudit, findings: Sequence[Finding]) -> ItemResult:
    """Distributions: entropy, concentration, masked mass and non-finite counts per site
    and head, region mass on expected keys and the first example's words."""
    checks = _findings_for(findings, ("non_finite", "masked_mass", "negative"))
    table = site_metric_table(audit.metrics, DISTRIBUTION_METRICS)
    recorded = set(table["metric"])
    evidence = [Evidence("distribution_metrics", "Attention distribution metrics",
                         "Per site, head and metric over every counted row (docs/metrics.md "
                         "definitions; entropy in nats).", table),
                Evidence("site_summary", "Per-site summary",
                         "Row counts and worst values per site.", audit.site_summary),
                _findings_evidence("numeric_findings", "Numeric checks", checks)]
    if not audit.regions.empty:
        evidence.append(Evidence(
            "regions", "Mass on the expected keys",
            "region_mass and top_weight_hit per expectation, site, head and step; "
            "':head_mean' sites average the heads first. Concentration on expected keys "
            "describes the retrieval, not why the output was produced.", audit.regions))
    words = (word_attention_table(audit.example) if audit.example is not None
             else pd.DataFrame())
    if not words.empty:
        evidence.append(Evidence(
            "word_attention", "Cross-attention per source word (first example)",
            "Per cross site, step and source word: the sum of the word's token weights, "
            "averaged over heads. Words: rule 'offsets' = whitespace-separated words of the "
            "text, a token in the word of its first non-space character; 'located' = token "
            "labels found in the text, then the same; 'markers' = Ġ / ▁ start a word, ## "
            "continues one.", words))
    not_recorded = [f"{m} (no site exposes it)" for m in ("output_norm", "score_min")
                    if m not in recorded]
    observations = []
    for s in audit.site_summary.itertuples(index=False):
        observations.append(f"{s.site}: mean entropy_norm {s.entropy_norm_mean:.3g}, mean "
                            f"max_weight {s.max_weight_mean:.3g} over {s.n_valid_mean:.3g} "
                            "eligible keys on average.")
    return ItemResult(
        ITEM_BY_KEY["distributions"], worst(f.status for f in checks),
        "Entropy, concentration, masked mass and non-finite counts per site and head; score "
        "ranges and output norms where the mechanism exposes them.",
        measured=["Streaming analysers over every counted row: entropy, entropy_norm, "
                  "effective_keys, kl_to_uniform, max_weight, masked_mass, non_finite, "
                  "negative, row_sum_error; score_min/score_max over eligible keys and "
                  "output_norm = ||sum_j w_j v_j|| where scores and values were captured."],
        observations=observations + _finding_lines(checks),
        not_recorded=not_recorded,
        evidence=evidence,
    )


# The performance item's thresholds on the capture overhead: the median over batches of
def validity_verdict(findings: Sequence[Finding], missing: str | None) -> Verdict:
    """Whether the attention is a valid weighted retrieval computation, from every finding;
    not recorded with the reason ``missing`` when the audit did not run."""
    question = "Valid weighted retrieval computation?"
    if missing is not None:
        return Verdict("validity", question, NOT_RECORDED, "Not recorded.", [missing])
    status = worst(f.status for f in findings)
    failing = [f for f in findings if f.status == FAIL]
    warning = [f for f in findings if f.status == WARN]
    sites = sorted({f.site for f in findings})
    if status == FAIL:
        answer = (f"No: {len(failing)} check(s) fail at "
                  f"{len({f.site for f in failing})} of {len(sites)} site(s).")
    elif status == WARN:
        answer = ("Yes on the gate checks (finite, no masked mass, rows sum to one, no NaN on "
                  f"all-masked rows), with {len(warning)} warning(s).")
    else:
        answer = (f"Yes, within tolerance at all {len(sites)} site(s): weights are finite, "
                  "non-negative, sum to one over the keys and put no mass on ineligible "
                  "keys.")
    reasons = [f"{f.site}, {f.check}: {f.status} ({f.detail})" for f in failing + warning] or [
        "This establishes that each attention row is a proper weighted average over its "
        "eligible keys; it says nothing about whether the weights explain the output."]
    return Verdict("validity", question, status, answer, reasons)
