"""The intervention item and the verdict on explanatory claims, from the suite's tables.

Suite tables are recognised by their columns (:func:`find_table`), so the checklist reads
any suite that uses docs/metrics.md names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


def interventions_item(suite: SuiteTables) -> ItemResult:
    """The intervention item: every suite table as evidence, a sentence per recognised
    result, the status from :func:`explanation_status`."""
    tables = dict(suite.tables)
    evidence = [Evidence(name, name.replace("_", " ").capitalize(),
                         "From the intervention suite (docs/metrics.md protocols).", frame)
                for name, frame in tables.items() if name not in CONTRIBUTION_TABLES]
    observations = [line for line, _ in intervention_lines(tables)]
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


def find_table(tables: Mapping[str, pd.DataFrame], columns: Iterable[str]
               ) -> pd.DataFrame | None:
    """The first table with rows that has every one of ``columns`` (tables are recognised by
    content; an empty table counts as absent), or None."""
    wanted = set(columns)
    return next((t for t in tables.values() if len(t) and wanted <= set(t.columns)), None)


def _rate(series: pd.Series) -> float:
    return float(pd.to_numeric(series, errors="coerce").astype(float).mean())


def agreement_summary(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame | None:
    """The agreement summary (method_a, method_b, kendall_tau_mean, ...) with a ``pair``
    label column, or None when the suite has none."""
    found = find_table(tables, ("method_a", "method_b", "kendall_tau_mean", "sig_frac", "n"))
    if found is None:
        return None
    return found.assign(pair=found["method_a"].astype(str) + " vs "
                        + found["method_b"].astype(str))


def intervention_lines(tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(sentence, misconception key or "") for every recognised intervention result."""
    lines: list[tuple[str, str]] = []
    perm = find_table(tables, ("max_attention", "perm_median_tvd"))
    if perm is not None:
        share = float((perm["perm_median_tvd"] < SMALL_TVD).mean())
        lines.append((f"Permutation: for {share:.0%} of {len(perm)} rows, shuffling the "
                      "weights among eligible keys changes the output distribution by a "
                      f"median TVD below {SMALL_TVD}.", "causal_explanation"))
        sharp = perm[perm["max_attention"] > 0.75]
        if len(sharp):
            lines.append((f"Rows whose largest weight exceeds 0.75 ({len(sharp)}): median "
                          f"permutation TVD {sharp['perm_median_tvd'].median():.3g}; "
                          f"{(sharp['perm_median_tvd'] < SMALL_TVD).mean():.0%} of them "
                          f"below {SMALL_TVD}.", "sharp_is_correct"))
    uniform = find_table(tables, ("uniform_tvd", "uniform_flip"))
    if uniform is not None:
        lines.append((f"Uniform weights over the eligible keys: mean output TVD "
                      f"{uniform['uniform_tvd'].mean():.3g}, argmax flips in "
                      f"{_rate(uniform['uniform_flip']):.0%} of {len(uniform)} rows.",
                      "causal_explanation"))
    zeroing = find_table(tables, ("zero_top_flip", "zero_random_flip"))
    if zeroing is not None:
        lines.append((f"Zeroing the top-weighted key flips the argmax in "
                      f"{_rate(zeroing['zero_top_flip']):.0%} of rows; zeroing a random "
                      f"other eligible key in {_rate(zeroing['zero_random_flip']):.0%}.",
                      "larger_score"))
    cumulative = find_table(tables, ("order", "n_flipped", "never_flipped",
                                     "frac_keys_median"))
    if cumulative is not None:
        parts = [f"{r.order}: median {r.frac_keys_median:.3g} of the keys "
                 f"({r.never_flipped} of {r.n} never flipped)"
                 for r in cumulative.itertuples(index=False)]
        lines.append(("Cumulative removal until the argmax flips — " + "; ".join(parts) + ".",
                      ""))
    values = find_table(tables, ("value_zero_tvd",))
    if values is not None:
        controls = [c[len("value_"):-len("_tvd")] for c in values.columns
                    if c.startswith("value_") and c.endswith("_tvd")]
        parts = [f"{c}: mean TVD {values[f'value_{c}_tvd'].mean():.3g}"
                 + (f", flips {_rate(values[f'value_{c}_flip']):.0%}"
                    if f"value_{c}_flip" in values.columns else "") for c in controls]
        lines.append(("Value replacement at the top-weighted key — " + "; ".join(parts)
                      + ". This tests whether that position's content mattered, not whether "
                      "the weight was right.", "larger_score"))
    sequence = find_table(tables, ("protocol", "exact_match", "edit_distance"))
    if sequence is not None:
        parts = [f"{protocol}: {_rate(group['exact_match']):.0%} of {len(group)} unchanged, "
                 f"mean edit distance {group['edit_distance'].mean():.3g} tokens"
                 for protocol, group in sequence.groupby("protocol", sort=False)]
        lines.append(("Decoded again with the edit held at every step, the returned text — "
                      + "; ".join(parts) + ".", "causal_explanation"))
    adversarial = find_table(tables, ("eps_max_jsd",))
    if adversarial is not None:
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
    return lines + contribution_lines(tables)


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
    if perm is None:
        return WARN
    insensitive = float((perm["perm_median_tvd"] < SMALL_TVD).mean())
    zeroing = find_table(tables, ("zero_top_flip", "zero_random_flip"))
    top_matters = zeroing is None or (
        _rate(zeroing["zero_top_flip"]) > _rate(zeroing["zero_random_flip"]))
    uniform = find_table(tables, ("uniform_flip",))
    uniform_flips = 1.0 if uniform is None else _rate(
        uniform["uniform_flip"])
    adversarial = find_table(tables, ("eps_max_jsd",))
    unique = adversarial is None or (
        float(adversarial["eps_max_jsd"].mean()) < ADVERSARIAL_DIFFERENT)
    if insensitive < 0.5 and top_matters and unique:
        return PASS
    if insensitive >= 0.9 and uniform_flips < SMALL_TVD:
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
