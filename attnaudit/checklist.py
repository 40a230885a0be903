"""The audit checklist: findings mapped onto the eight items an attention audit should record.

The items, their wording and the misconceptions come from the source text "Attention
modules need targeted tests" (seed 003). Each item gets a status — ``pass``, ``warn``,
``fail`` or ``not recorded`` — what was measured and how, and its evidence as tidy tables.
Two verdicts sit on top: whether the attention is a valid weighted retrieval computation
(from the validity findings) and how much support the interventions give to explanatory
claims. Plain data and functions only; the report renders it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from torch import nn

PASS, WARN, FAIL, NOT_RECORDED = "pass", "warn", "fail", "not recorded"
STATUSES = (PASS, WARN, FAIL, NOT_RECORDED)
_SEVERITY = {NOT_RECORDED: -1, PASS: 0, WARN: 1, FAIL: 2}


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
_MISCONCEPTION = {m.key: m for m in MISCONCEPTIONS}


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


@dataclass
class Verdict:
    key: str
    question: str
    status: str
    answer: str
    reasons: list[str]


@dataclass
class MisconceptionNote:
    claim: str
    correction: str
    evidence: str


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


def worst(statuses: Iterable[str]) -> str:
    """The most severe status; ``not recorded`` when there is none."""
    found = [s for s in statuses if s != NOT_RECORDED]
    if not found:
        return NOT_RECORDED
    for status in found:
        if status not in _SEVERITY:
            raise ValueError(f"unknown status {status!r}; expected one of {STATUSES}")
    return max(found, key=_SEVERITY.__getitem__)


def parameter_table(model: nn.Module, site_modules: Mapping[str, str]) -> pd.DataFrame:
    """Parameters of each site's module and the tensors they share storage with.

    Args:
        model: the audited model.
        site_modules: site name -> module path that computes it ("" for the root module).

    Returns:
        One row per (site, parameter): ``site``, ``module``, ``parameter`` (full name),
        ``shape``, ``numel``, ``shared_with`` (other parameter names backed by the same
        tensor, ``;``-separated, empty when none).
    """
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    modules = dict(model.named_modules())
    rows = []
    for site, path in site_modules.items():
        module = modules.get(path)
        if module is None:
            continue
        prefix = f"{path}." if path else ""
        for name, param in module.named_parameters():
            full = prefix + name
            others = [o for o in owners.get(id(param), []) if o != full]
            rows.append({"site": site, "module": path or "(root)", "parameter": full,
                         "shape": "x".join(map(str, param.shape)), "numel": param.numel(),
                         "shared_with": ";".join(others)})
    return pd.DataFrame(rows, columns=["site", "module", "parameter", "shape", "numel",
                                       "shared_with"])


def site_metric_table(metrics: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per site x head x metric over all query steps: n, mean (row-weighted), min, max.

    ``metrics`` is the audit's tidy table (one row per site x head x step x metric).
    """
    part = metrics[metrics["metric"].isin(names)]
    columns = ["site", "head", "metric", "n", "mean", "min", "max"]
    if part.empty:
        return pd.DataFrame(columns=columns)
    grouped = part.groupby(["site", "head", "metric"], sort=True)
    out = grouped.agg(n=("n", "sum"), total=("sum", "sum"), min=("min", "min"),
                      max=("max", "max")).reset_index()
    out["mean"] = out["total"] / out["n"]
    return out[columns]


def _findings_for(findings: Sequence[Any], checks: Sequence[str]) -> list[Any]:
    return [f for f in findings if f.check in checks]


def _findings_evidence(name: str, title: str, findings: Sequence[Any]) -> Evidence:
    frame = pd.DataFrame([{"site": f.site, "check": f.check, "status": f.status,
                           "rows": f.rows, "value": f.value, "detail": f.detail}
                          for f in findings],
                         columns=["site", "check", "status", "rows", "value", "detail"])
    return Evidence(name, title, "Per site and check; rows = failing (example, head, query "
                    "step) rows.", frame)


def _finding_lines(findings: Sequence[Any]) -> list[str]:
    """One line per finding that does not pass; one line for all those that do."""
    lines = [f"{f.site}, {f.check}: {f.status} ({f.detail})" for f in findings
             if f.status != PASS]
    passed = [f for f in findings if f.status == PASS]
    if passed:
        checks = ", ".join(sorted({f.check for f in passed}))
        lines.append(f"{len(passed)} check(s) pass ({checks}) at "
                     f"{len({f.site for f in passed})} site(s); details in the table below.")
    return lines


def _missing(item: ChecklistItem, reason: str) -> ItemResult:
    return ItemResult(item, NOT_RECORDED, f"Not recorded: {reason}",
                      not_recorded=[reason])


_ITEM = {item.key: item for item in ITEMS}
SITE_MODULES_CAPTION = ("One row per attention site, as capture saw it: mechanism, module, "
                        "heads, largest query and key counts, and the role (cross, encoder "
                        "or decoder self-attention) its shape matched.")


def _qkv(model: nn.Module, audit: Any) -> ItemResult:
    sites = audit.sites
    params = parameter_table(model, dict(zip(sites["site"], sites["module"], strict=True)))
    unmatched = sites.loc[sites["role"].str.contains("captured"), "site"].tolist()
    shared = params[params["shared_with"] != ""]
    observations = [
        f"{s.site}: {s.mechanism} attention in module {s.module or '(root)'}, {s.heads} "
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
        _ITEM["qkv"], WARN if unmatched else PASS,
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


def _dropout_table(model: nn.Module, site_modules: Mapping[str, str]) -> pd.DataFrame:
    """Dropout modules and ``dropout`` rate attributes (> 0) inside each site's module."""
    modules = dict(model.named_modules())
    rows = []
    for site, path in site_modules.items():
        module = modules.get(path)
        if module is None:
            continue
        for name, sub in module.named_modules():
            full = ".".join(p for p in (path, name) if p) or "(root)"
            # Rate 0 is no dropout (e.g. nn.LSTM's default inter-layer rate); leave it out.
            if isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0:
                rows.append({"site": site, "module": full, "kind": type(sub).__name__,
                             "p": float(sub.p), "training": sub.training})
            elif isinstance(getattr(sub, "dropout", None), float) and sub.dropout > 0:
                rows.append({"site": site, "module": full, "kind": "dropout attribute",
                             "p": float(sub.dropout), "training": sub.training})
    return pd.DataFrame(rows, columns=["site", "module", "kind", "p", "training"])


def _scoring(model: nn.Module, audit: Any, findings: Sequence[Any]) -> ItemResult:
    checks = _findings_for(findings, ("row_sum", "softmax_axis"))
    scores = site_metric_table(audit.metrics, ("score_min", "score_max", "score_mean"))
    dropout = _dropout_table(model, dict(zip(audit.sites["site"], audit.sites["module"],
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
        _ITEM["scoring"], worst(f.status for f in checks),
        "Normalisation axis and row sums checked at every site; score function and scale "
        "are read from the mechanism only.",
        measured=["Each row's sum over the key axis was compared with 1 (row_sum_error, "
                  f"tolerance {audit.row_sum_tolerance:g}); an (example, head) whose rows do "
                  "not sum to one while its columns do is flagged as a softmax over the wrong "
                  "axis.",
                  "Pre-softmax scores were captured where the mechanism exposes them and "
                  "their range over eligible keys recorded."],
        observations=observations + _finding_lines(checks),
        not_recorded=["The score function (additive, dot product, bilinear) and any scale or "
                      "temperature are properties of the model's code; attnaudit records the "
                      "mechanism that computed the softmax, not the formula."],
        evidence=evidence,
    )


def _eligibility(audit: Any, findings: Sequence[Any]) -> ItemResult:
    checks = _findings_for(findings, ("eligibility", "masked_mass"))
    rules = audit.sites[["site", "kind", "role", "eligibility", "key_mask_shape"]]
    return ItemResult(
        _ITEM["eligibility"], worst(f.status for f in checks),
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


def _masks(audit: Any, findings: Sequence[Any]) -> ItemResult:
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
        _ITEM["masks"], worst(f.status for f in checks),
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


def _positions(model: nn.Module, audit: Any) -> ItemResult:
    observations = [f"{s.site}: up to {s.queries} query steps and {s.keys} keys per batch."
                    for s in audit.sites.itertuples(index=False)]
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int):
        longest = int(audit.sites["keys"].max())
        observations.append(f"The model's config allows {limit} positions; the longest "
                            f"captured key axis was {longest}.")
    return ItemResult(
        _ITEM["positions"], NOT_RECORDED,
        "Position conventions, truncation and cache policy are not measured automatically; "
        "the audit protocol and the lengths seen are listed.",
        measured=["Protocol: greedy decoding, then the model's own output teacher-forced in "
                  "one forward pass (for Hugging Face targets without the key/value cache); "
                  "captured query rows are emitted steps, keys are source positions."],
        observations=observations,
        not_recorded=["How source and target positions are numbered, whether inputs were "
                      "truncated by a tokenizer, and whether a cache changes the computation "
                      "are not inspected."],
    )


DISTRIBUTION_METRICS = ("entropy", "entropy_norm", "effective_keys", "kl_to_uniform",
                        "max_weight", "n_valid", "masked_mass", "non_finite", "negative",
                        "row_sum_error", "score_min", "score_max", "output_norm")


def _distributions(audit: Any, findings: Sequence[Any]) -> ItemResult:
    checks = _findings_for(findings, ("non_finite", "masked_mass", "negative"))
    table = site_metric_table(audit.metrics, DISTRIBUTION_METRICS)
    recorded = set(table["metric"])
    evidence = [Evidence("distribution_metrics", "Attention distribution metrics",
                         "Per site, head and metric over every counted row (METRICS.md "
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
    not_recorded = [f"{m} (no site exposes it)" for m in ("output_norm", "score_min")
                    if m not in recorded]
    observations = []
    for s in audit.site_summary.itertuples(index=False):
        observations.append(f"{s.site}: mean entropy_norm {s.entropy_norm_mean:.3g}, mean "
                            f"max_weight {s.max_weight_mean:.3g} over {s.n_valid_mean:.3g} "
                            "eligible keys on average.")
    return ItemResult(
        _ITEM["distributions"], worst(f.status for f in checks),
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


def _performance(audit: Any) -> ItemResult:
    perf = audit.performance
    if perf.empty:
        return _missing(_ITEM["performance"], "no batch was timed")
    totals = {
        "examples": int(perf["examples"].sum()),
        "greedy_s": float(perf["greedy_s"].sum()),
        "plain_s": float(perf["plain_s"].sum()),
        "captured_s": float(perf["captured_s"].sum()),
        "valid_tokens": int(perf["source_tokens"].sum() + perf["target_tokens"].sum()),
        "plain_peak_mib_max": float(perf["plain_peak_mib"].max()),
        "captured_peak_mib_max": float(perf["captured_peak_mib"].max()),
        "capture_mib_max": float(perf["capture_mib"].max()),
    }
    timed = totals["plain_s"] > 0 and pd.notna(totals["plain_s"])
    totals["tokens_per_s_plain"] = (totals["valid_tokens"] / totals["plain_s"] if timed
                                    else float("nan"))
    materialised = audit.sites.loc[audit.sites["scores_materialised_by_capture"], "site"]
    observations = [
        f"Teacher-forced forward without capture: {totals['plain_s']:.3g} s for "
        f"{totals['examples']} examples, {totals['tokens_per_s_plain']:.4g} valid tokens/s; "
        f"with capture {totals['captured_s']:.3g} s; greedy decoding "
        f"{totals['greedy_s']:.3g} s.",
        f"Peak memory above the starting level: {totals['plain_peak_mib_max']:.3g} MiB "
        f"without capture, {totals['captured_peak_mib_max']:.3g} MiB with; capture kept up "
        f"to {totals['capture_mib_max']:.3g} MiB of tensors per batch.",
        (f"Score matrices materialised only because capture computed them explicitly: "
         f"{', '.join(materialised)}." if len(materialised) else
         "No site needed capture to materialise a score matrix the model would not have "
         "formed itself (softmax-path sites compute weights explicitly)."),
    ]
    unreadable = perf[["plain_peak_mib", "captured_peak_mib"]].isna().all().all()
    return ItemResult(
        _ITEM["performance"], WARN if unreadable or not timed else PASS,
        "Latency, peak memory and valid-token throughput measured per batch on this machine.",
        measured=["Per batch: wall time of greedy decoding and of the teacher-forced forward "
                  "without and with capture (alternating which runs first), peak memory "
                  "above the level at entry (CUDA allocator, or peak RSS on Linux), and "
                  "valid tokens (real source tokens + emitted steps up to EOS) per second."],
        observations=observations,
        not_recorded=["Peak memory could not be read on this platform."] if unreadable
        else [],
        evidence=[Evidence("performance", "Performance per batch",
                           "Seconds, MiB and valid tokens per second; absolute numbers "
                           "depend on the machine and its load.", perf),
                  Evidence("performance_totals", "Performance totals",
                           "Sums over batches; peaks are the largest batch's.",
                           pd.DataFrame([totals]))],
    )


def _interventions(suite: Any) -> ItemResult:
    tables = dict(suite.tables)
    evidence = [Evidence(name, name.replace("_", " ").capitalize(),
                         "From the intervention suite (METRICS.md protocols).", frame)
                for name, frame in tables.items()]
    observations = [line for line, _ in _intervention_lines(tables)]
    return ItemResult(
        _ITEM["interventions"], explanation_status(tables),
        "Weights, values and inputs were intervened on and the output distribution compared.",
        measured=["Teacher-forced on the model's own greedy output; each intervention edits "
                  "the attention inside the forward pass and compares the per-step output "
                  "distribution with the unedited one (TVD, JSD, argmax flips).",
                  *_suite_settings(getattr(suite, "metadata", {}))],
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
    return lines


SMALL_TVD = 0.05  # METRICS.md: the share of rows whose median permutation TVD is below this


def find_table(tables: Mapping[str, pd.DataFrame], columns: Iterable[str]
               ) -> pd.DataFrame | None:
    """The first table that has every one of ``columns`` (tables are recognised by content)."""
    wanted = set(columns)
    return next((t for t in tables.values() if wanted <= set(t.columns)), None)


def _rate(series: pd.Series) -> float:
    return float(pd.to_numeric(series, errors="coerce").astype(float).mean())


def agreement_summary(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """The agreement summary (method_a, method_b, kendall_tau_mean, ...) with a ``pair``
    label column, or None when the suite has none."""
    found = find_table(tables, ("method_a", "method_b", "kendall_tau_mean", "sig_frac", "n"))
    if found is None or not len(found):
        return None
    return found.assign(pair=found["method_a"].astype(str) + " vs "
                        + found["method_b"].astype(str))


def _intervention_lines(tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(sentence, misconception key or "") for every recognised intervention result."""
    lines: list[tuple[str, str]] = []
    perm = find_table(tables, ("max_attention", "perm_median_tvd"))
    if perm is not None and len(perm):
        share = float((perm["perm_median_tvd"] < SMALL_TVD).mean())
        lines.append((f"Permutation: for {share:.0%} of {len(perm)} rows, shuffling the "
                      "weights among eligible keys changes the output distribution by a "
                      f"median TVD below {SMALL_TVD}.", "causal_explanation"))
        sharp = perm[perm["max_attention"] > 0.75]
        if len(sharp):
            lines.append((f"Rows whose largest weight exceeds 0.75 ({len(sharp)}): median "
                          f"permutation TVD {sharp['perm_median_tvd'].median():.3g}; "
                          f"{(sharp['perm_median_tvd'] < SMALL_TVD).mean():.0%} of them "
                          "below 0.05.", "sharp_is_correct"))
    uniform = find_table(tables, ("uniform_tvd", "uniform_flip"))
    if uniform is not None and len(uniform):
        lines.append((f"Uniform weights over the eligible keys: mean output TVD "
                      f"{uniform['uniform_tvd'].mean():.3g}, argmax flips in "
                      f"{_rate(uniform['uniform_flip']):.0%} of {len(uniform)} rows.",
                      "causal_explanation"))
    zeroing = find_table(tables, ("zero_top_flip", "zero_random_flip"))
    if zeroing is not None and len(zeroing):
        lines.append((f"Zeroing the top-weighted key flips the argmax in "
                      f"{_rate(zeroing['zero_top_flip']):.0%} of rows; zeroing a random "
                      f"other eligible key in {_rate(zeroing['zero_random_flip']):.0%}.",
                      "larger_score"))
    cumulative = find_table(tables, ("order", "n_flipped", "never_flipped",
                                     "frac_keys_median"))
    if cumulative is not None and len(cumulative):
        parts = [f"{r.order}: median {r.frac_keys_median:.3g} of the keys "
                 f"({r.never_flipped} of {r.n} never flipped)"
                 for r in cumulative.itertuples(index=False)]
        lines.append(("Cumulative removal until the argmax flips — " + "; ".join(parts) + ".",
                      ""))
    values = find_table(tables, ("value_zero_tvd",))
    if values is not None and len(values):
        controls = [c[len("value_"):-len("_tvd")] for c in values.columns
                    if c.startswith("value_") and c.endswith("_tvd")]
        parts = [f"{c}: mean TVD {values[f'value_{c}_tvd'].mean():.3g}"
                 + (f", flips {_rate(values[f'value_{c}_flip']):.0%}"
                    if f"value_{c}_flip" in values.columns else "") for c in controls]
        lines.append(("Value replacement at the top-weighted key — " + "; ".join(parts)
                      + ". This tests whether that position's content mattered, not whether "
                      "the weight was right.", "larger_score"))
    adversarial = find_table(tables, ("eps_max_jsd",))
    if adversarial is not None and len(adversarial):
        jsd = adversarial["eps_max_jsd"]
        lines.append((f"Adversarial attention ({len(jsd)} rows): eps-max JSD median "
                      f"{jsd.median():.3g}, mean {jsd.mean():.3g} (at most ln 2 = 0.693) "
                      "between the original weights and the most different weights found "
                      "that keep the output within the TVD bound.", "causal_explanation"))
    agreement = agreement_summary(tables)
    if agreement is not None:
        parts = [f"{r.pair}: {r.kendall_tau_mean:.3g} (sig_frac {r.sig_frac:.2f}, {r.n} rows)"
                 for r in agreement.itertuples(index=False)]
        lines.append(("Mean Kendall tau-b between importance rankings — " + "; ".join(parts)
                      + ". Jain & Wallace report 0.24-0.44 between attention and gradients "
                      "for BiLSTM classifiers with additive attention (a different task).",
                      "causal_explanation"))
    return lines


# Mean eps-max JSD (of at most ln 2) from which the adversarial search counts as having
# found very different weights with the same output: the weights are then not the only
# allocation the output supports, so they cannot pass as its explanation.
ADVERSARIAL_DIFFERENT = 0.1


def explanation_status(tables: Mapping[str, pd.DataFrame]) -> str:
    """pass: outputs depend on which keys the weights select (permutation changes most rows,
    zeroing the top key flips more often than a random one) and, when the adversarial search
    ran, it found no very different weights (mean eps-max JSD below
    ``ADVERSARIAL_DIFFERENT``) that keep the output; fail: permutation leaves nearly every
    row unchanged and uniform weights flip almost nothing; warn: in between or no
    recognised result; not recorded: no table."""
    if not tables:
        return NOT_RECORDED
    perm = find_table(tables, ("max_attention", "perm_median_tvd"))
    if perm is None or not len(perm):
        return WARN
    insensitive = float((perm["perm_median_tvd"] < SMALL_TVD).mean())
    zeroing = find_table(tables, ("zero_top_flip", "zero_random_flip"))
    top_matters = zeroing is None or not len(zeroing) or (
        _rate(zeroing["zero_top_flip"]) > _rate(zeroing["zero_random_flip"]))
    uniform = find_table(tables, ("uniform_flip",))
    uniform_flips = 1.0 if uniform is None or not len(uniform) else _rate(
        uniform["uniform_flip"])
    adversarial = find_table(tables, ("eps_max_jsd",))
    unique = adversarial is None or not len(adversarial) or (
        float(adversarial["eps_max_jsd"].mean()) < ADVERSARIAL_DIFFERENT)
    if insensitive < 0.5 and top_matters and unique:
        return PASS
    if insensitive >= 0.9 and uniform_flips < SMALL_TVD:
        return FAIL
    return WARN


def build_checklist(model: nn.Module, audit: Any | None, suite: Any | None, *,
                    audit_reason: str | None = None,
                    suite_reason: str | None = None) -> Checklist:
    """Map a validity audit and an intervention suite onto the checklist.

    Args:
        model: the audited model (its parameters and modules are inspected, not run).
        audit: a :class:`attnaudit.audit.ValidityAudit`, or None when not run.
        suite: an intervention suite result (``tables``: name -> DataFrame), or None.
        audit_reason, suite_reason: why a part is missing; shown as "not recorded".
    """
    no_audit = audit_reason or "the validity audit was not run"
    no_suite = suite_reason or "the intervention suite was not run"
    if audit is None:
        items = [_missing(item, no_audit) for item in ITEMS if item.key != "interventions"]
        findings: list[Any] = []
    else:
        findings = audit.findings()
        items = [_qkv(model, audit), _scoring(model, audit, findings),
                 _eligibility(audit, findings), _masks(audit, findings),
                 _positions(model, audit), _distributions(audit, findings),
                 _performance(audit)]
    items.append(_missing(_ITEM["interventions"], no_suite) if suite is None
                 else _interventions(suite))
    verdicts = [_validity_verdict(findings, no_audit if audit is None else None),
                _explanation_verdict(items[-1], suite)]
    return Checklist(items, verdicts, _misconception_notes(model, audit, findings, suite))


def _validity_verdict(findings: Sequence[Any], missing: str | None) -> Verdict:
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


def _explanation_verdict(item: ItemResult, suite: Any | None) -> Verdict:
    question = "Support for explanatory claims"
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


def _metric_mean(audit: Any, metric: str) -> float | None:
    part = audit.metrics[audit.metrics["metric"] == metric]
    n = part["n"].sum()
    return float(part["sum"].sum() / n) if n else None


def _metric_range(audit: Any, low: str, high: str) -> tuple[float, float] | None:
    lo = audit.metrics.loc[audit.metrics["metric"] == low, "min"]
    hi = audit.metrics.loc[audit.metrics["metric"] == high, "max"]
    return (float(lo.min()), float(hi.max())) if len(lo) and len(hi) else None


def _misconception_notes(model: nn.Module, audit: Any | None, findings: Sequence[Any],
                         suite: Any | None) -> list[MisconceptionNote]:
    """The misconceptions something measured here bears on, with what was measured."""
    notes: dict[str, str] = {}
    by_check: dict[str, list[Any]] = {}
    for f in findings:
        by_check.setdefault(f.check, []).append(f)

    def checked(check: str) -> str | None:
        group = by_check.get(check)
        return None if not group else worst(f.status for f in group)

    if audit is not None:
        keys, top = _metric_mean(audit, "effective_keys"), _metric_mean(audit, "max_weight")
        if keys is not None and top is not None:
            notes["one_item"] = (f"Mean effective number of keys exp(H) = {keys:.3g} and mean "
                                 f"largest weight {top:.3g}: each row mixes "
                                 f"{'several keys' if keys > 1.05 else 'almost one key'}.")
        if checked("row_sum") == PASS:
            notes["independent"] = ("Every counted row sums to one over its keys (row_sum "
                                    "check passes), so weights trade off against each other.")
        scores = _metric_range(audit, "score_min", "score_max")
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
        if "decoder_self" in roles:
            notes["padding_vs_causal"] = ("Decoder self-attention was checked against the "
                                          "causal rule, source attention against padding.")
        if roles & {"encoder_self", "decoder_self"}:
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
        separate = _separate_key_value(model, audit)
        if separate:
            notes["keys_are_values"] = separate
    if suite is not None:
        for line, key in _intervention_lines(dict(suite.tables)):
            if key:
                notes[key] = f"{notes[key]} {line}" if key in notes else line
    return [MisconceptionNote(m.claim, m.correction, notes[m.key])
            for m in MISCONCEPTIONS if m.key in notes]


def _separate_key_value(model: nn.Module, audit: Any) -> str:
    """A sentence when a site's module has distinct key and value projection tensors."""
    params = parameter_table(model, dict(zip(audit.sites["site"], audit.sites["module"],
                                             strict=True)))
    found = []
    for site, part in params.groupby("site", sort=True):
        names = part["parameter"].tolist()
        key = [n for n in names if n.endswith(("k_proj.weight", "key.weight"))]
        value = [n for n in names if n.endswith(("v_proj.weight", "value.weight"))]
        if key and value:
            found.append(f"{site} ({key[0]}, {value[0]})")
    if not found:
        return ""
    return ("Separate key and value projection tensors: " + "; ".join(found) + ".")
