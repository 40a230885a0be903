"""What a validity audit measured (:class:`ValidityAudit`), and the findings read off it.

:meth:`ValidityAudit.findings` is the one source the CI gate (:mod:`attnaudit.validity.gate`),
the pytest helper (:mod:`attnaudit.testing`), the checklist and the report read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from attnaudit.analysis.cached_decoding import NOT_COMPARED, CachedDecoding
from attnaudit.analysis.degenerate import DegenerateCounter
from attnaudit.analysis.example_maps import ExampleMaps
from attnaudit.errors import OptionError
from attnaudit.validity.analysers import DEFAULT_MAX_MASKED_MASS, DEFAULT_ROW_SUM_TOLERANCE
from attnaudit.validity.findings import Finding, describe_tolerance, site_findings


@dataclass
class ValidityAudit:
    """What :func:`~attnaudit.validity.pipeline.run_validity_audit` measured. Every table is
    a tidy DataFrame.

    Attributes:
        target, description: the target's name and description.
        examples: examples audited.
        sites: one row per site (:mod:`attnaudit.validity.sites`): site, kind, role,
            mechanism, module, layer, heads, queries, keys (largest seen),
            scores_available, values_available, key_mask_shape (the key mask as capture
            derived it; the mask's own dtype is not kept by capture), eligibility (the key
            rules used), scores_materialised_by_capture.
        metrics: analyser summaries, one row per site x head x step x metric (columns of
            :meth:`attnaudit.analysis.RowStats.frame`; row counts:
            :mod:`attnaudit.validity.analysers`).
        regions: region_mass / top_weight_hit per expectation x site x head x step, cross
            sites only; sites suffixed ``:head_mean`` hold the head average.
        site_summary: one row per site (see
            :func:`~attnaudit.validity.findings.summarise_sites`).
        performance: one row per batch (see :mod:`attnaudit.validity.timing`).
        example: the first example's attention maps, when kept.
        kept_examples: the maps of the first examples kept (``keep_examples``), in data
            order; ``example`` is the first of them.
        truncation: how the target truncated its sources ("" when it does not say).
        decoding: one sentence on how the audited outputs were decoded ("" when unknown).
        degenerate: rows per degenerate reason (:mod:`attnaudit.analysis.degenerate`).
        cached_decoding: the model's own cached decoding against its teacher-forced pass
            (:mod:`attnaudit.analysis.cached_decoding`).
        max_masked_mass, row_sum_tolerance: the tolerances rows were counted at; a
            row_sum_tolerance of None means each site's dtype rule (the sites table's
            ``row_sum_tolerance`` column).
    """

    target: str
    description: str
    examples: int
    sites: pd.DataFrame
    metrics: pd.DataFrame
    regions: pd.DataFrame
    site_summary: pd.DataFrame
    performance: pd.DataFrame
    example: ExampleMaps | None
    kept_examples: list[ExampleMaps] = field(default_factory=list)
    truncation: str = ""
    decoding: str = ""
    degenerate: DegenerateCounter = field(default_factory=DegenerateCounter)
    cached_decoding: CachedDecoding = NOT_COMPARED
    max_masked_mass: float = DEFAULT_MAX_MASKED_MASS
    row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE

    def findings(self, max_masked_mass: float | None = None,
                 row_sum_tolerance: float | None = None) -> list[Finding]:
        """Every check at every site (see :func:`~attnaudit.validity.findings.site_findings`).

        The tolerances default to those the audit counted rows at; other values raise
        ValueError, since failing rows were counted while streaming.
        """
        for name, given, used in (("max_masked_mass", max_masked_mass, self.max_masked_mass),
                                  ("row_sum_tolerance", row_sum_tolerance,
                                   self.row_sum_tolerance)):
            if given is not None and given != used:
                raise OptionError(f"rows were counted at {name}={describe_tolerance(used)}; "
                                  f"run run_validity_audit(..., {name}={given:g}) for another "
                                  "tolerance")
        return site_findings(self.site_summary, self.sites, self.max_masked_mass,
                             dict(zip(self.sites["site"], self.sites["row_sum_tolerance"],
                                      strict=True)))

    @property
    def healthy(self) -> bool:
        """True when no finding fails."""
        return not any(f.status == "fail" for f in self.findings())
