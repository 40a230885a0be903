"""Printing results for the command line."""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnaudit.analysis.degenerate import describe_counts
from attnaudit.attribution.agreement import beside_reference
from attnaudit.auditing.intervention_suite import InterventionSuite

SUITE_TABLES = ("summary", "permutation_bins", "zeroing_flips", "cumulative_summary",
                "value_controls", "agreement_summary", "weights_vs_contributions",
                "alignment_aer")


def print_suite(suite: InterventionSuite) -> None:
    """The summary tables, with the Jain & Wallace reference values beside ours."""
    meta: dict[str, Any] = dict(suite.metadata)
    print(f"target {meta['target']}: {meta['examples']} examples, {meta['rows']} rows; "
          f"edited sites {meta['sites']}, heads {meta['edited_heads']}; seed {meta['seed']}")
    print(f"variant: {meta['protocol']}; attention = {meta['attention']}")
    print(f"cumulative test on {len(meta['cumulative_examples'])} seeded examples; adversarial "
          f"search on {len(meta['adversarial_examples'])} seeded examples "
          f"{meta['adversarial_examples']}; {meta['n_permutations']} permutations per row")
    print(f"degenerate rows, left out of every per-row protocol: "
          f"{describe_counts(meta['degenerate_rows'])}")
    with pd.option_context("display.width", 140, "display.max_columns", 20,
                           "display.max_colwidth", 60):
        for name in SUITE_TABLES:
            if name in suite.tables:
                print(f"\n{name}\n{suite.tables[name].to_string(index=False)}")
        reference = beside_reference(suite.tables["agreement_summary"], meta["target"])
        print("\nagreement beside Jain & Wallace (2019) reference values (mean Kendall tau)\n"
              + reference.to_string(index=False))
