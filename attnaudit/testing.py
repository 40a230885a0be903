"""Assertions for a project's own tests: the CI gate's checks inside pytest.

::

    from attnaudit.testing import assert_attention_healthy

    def test_attention_is_valid():
        assert_attention_healthy(model, lambda: model(src, tgt),
                                 eligible={"decoder.cross_attn": src != PAD})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from attnaudit.analysis.base import keys_before_queries
from attnaudit.capturing import capture
from attnaudit.capturing.sites import SiteSelection
from attnaudit.errors import OptionError
from attnaudit.validity.analysers import (
    DEFAULT_MAX_MASKED_MASS,
    DEFAULT_ROW_SUM_TOLERANCE,
    ValidityAnalysers,
)
from attnaudit.validity.findings import Finding, failing_sites, site_findings, summarise_sites


def assert_attention_healthy(model: nn.Module, run: Callable[[], Any], *,
                             sites: SiteSelection = None,
                             kinds: Mapping[str, str] | None = None,
                             eligible: Mapping[str, torch.Tensor] | None = None,
                             max_masked_mass: float = DEFAULT_MAX_MASKED_MASS,
                             row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE
                             ) -> list[Finding]:
    """Run ``run()`` under capture and assert every site passes the gate's checks.

    Args:
        model: the model whose attention ``run`` computes; left unchanged.
        run: a zero-argument callable that runs the model (a forward pass, a decoding loop).
        sites, kinds: as for :func:`attnaudit.capture`.
        eligible: declared key rules by site name (with or without the ``:kind``
            suffix): bool, True = the key may be attended, read by rank — (K,), (B, K) per
            example, (B, Q, K) or (B, H, Q, K). Without one, a site is checked against the
            key mask capture read off the model, which cannot reveal a mask applied after
            the softmax or masked scores filled with 0. A site whose softmax normalised an
            axis before its queries (the wrong axis) is checked without its rule, which
            names the model's keys, not the axis it normalised: it fails the softmax-axis
            check.
        max_masked_mass, row_sum_tolerance: the gate's tolerances (row_sum_tolerance None:
            from each site's weight dtype and key count, as the gate does).

    Returns:
        every finding (passes and warnings included) when no check fails.

    Raises:
        AssertionError: naming each failing site, check and failing row count.
    """
    declared = dict(eligible or {})
    analysers = ValidityAnalysers(max_masked_mass, row_sum_tolerance)
    with capture(model, sites, kinds=kinds) as cap:
        run()
    unknown = [name for name in declared
               if not any(name in (site, site.split(":", 1)[0]) for site in cap.records)]
    if unknown:
        raise OptionError(f"eligible names sites that were not captured: {unknown}; "
                         f"captured: {list(cap.records)}")
    for name, record in cap.records.items():
        rule = declared.get(name, declared.get(name.split(":", 1)[0]))
        wrong_axis = keys_before_queries(record.site.layout)
        analysers.update(record, eligible=None if wrong_axis else rule)
    summary = summarise_sites(analysers.metrics(), list(cap.records))
    findings = site_findings(summary, None, max_masked_mass, analysers.site_row_sum_tolerance)
    failures = [f for f in findings if f.status == "fail"]
    if failures:
        sites_failing = failing_sites(failures)
        raise AssertionError(
            f"attention is not a valid weighted retrieval at {len(sites_failing)} site(s): "
            + ", ".join(sites_failing) + "\n"
            + "\n".join(f"  {f.site}: {f.check}: {f.detail}" for f in failures))
    return findings
