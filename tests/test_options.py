""":mod:`attnaudit.options`: the defaults it writes out for the torch-free command line are
the library's own, its settings are checked once with one error type, and loose keywords
map into it in one place."""

from __future__ import annotations

import pytest

from attnaudit import options
from attnaudit.alignments import maps, units
from attnaudit.attribution.options import ALL_METHODS, AttributionOptions
from attnaudit.attribution.step_gradients import OUTPUTS
from attnaudit.auditing.intervention_suite import QUICK_PERMUTATIONS
from attnaudit.auditing.orchestration import attribution_options
from attnaudit.errors import OptionError, TargetError
from attnaudit.interventions.permutation import N_PERMUTATIONS
from attnaudit.interventions.work_budget import WORK_BUDGET
from attnaudit.report.explorer import DEFAULT_EXAMPLES
from attnaudit.targets.decoding import DECODING_MODES
from attnaudit.targets.placement import resolve_dtype
from attnaudit.validity import analysers
from attnaudit.validity.pipeline import run_validity_audit


def test_the_written_out_defaults_are_the_librarys():
    assert options.QUICK_PERMUTATIONS == QUICK_PERMUTATIONS
    assert options.N_PERMUTATIONS == N_PERMUTATIONS
    assert options.WORK_BUDGET == WORK_BUDGET
    assert options.DEFAULT_EXPLORER_EXAMPLES == DEFAULT_EXAMPLES
    assert options.DEFAULT_MAX_MASKED_MASS == analysers.DEFAULT_MAX_MASKED_MASS
    assert options.DEFAULT_ROW_SUM_TOLERANCE == analysers.DEFAULT_ROW_SUM_TOLERANCE
    assert options.DECODING_MODES == DECODING_MODES
    assert options.ATTRIBUTION_OUTPUTS == OUTPUTS
    assert options.ATTRIBUTION_METHODS == ALL_METHODS
    assert options.ALIGNMENT_MEASURES == maps.MEASURES
    assert options.ALIGNMENT_MEASURES[0] == maps.WEIGHTS
    assert options.ALIGNMENT_COMBINED == maps.COMBINED
    assert options.ALIGNMENT_UNITS == units.UNITS
    assert options.ALIGNMENT_CONVENTIONS == units.CONVENTIONS
    for name in options.DTYPES:
        resolve_dtype(name)  # each is a dtype the library places a model in
    for variant in options.ATTRIBUTION_VARIANTS:
        AttributionOptions.variant(variant)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_limit_is_checked_once_with_one_error_type(bad):
    with pytest.raises(OptionError, match="limit must be a positive number") as raised:
        options.AuditOptions(limit=bad)
    # a TargetError and a ValueError, as the three checks it replaces raised
    assert isinstance(raised.value, TargetError) and isinstance(raised.value, ValueError)
    with pytest.raises(OptionError, match="limit must be a positive number"):
        run_validity_audit(None, limit=bad)  # type: ignore[arg-type]  (refused first)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: options.AuditOptions(mode="fast"), "mode must be one of checks, quick, full"),
    (lambda: options.AuditOptions(explorer_examples=0), "explorer_examples must be"),
    (lambda: options.AuditOptions(dtype="float8"), "dtype must be one of"),
    (lambda: options.AuditOptions(max_memory=0), "max_memory must be a byte count"),
    (lambda: options.AuditOptions(work_budget=0), "work_budget must be a number"),
    (lambda: options.AuditOptions(work_budget="1e12"), "work_budget must be a number"),
    (lambda: options.AuditOptions(edits=("a",)), "edits must be an attnaudit.options.Edits"),
    (lambda: options.Edits(heads=(0, 0)), "heads must be distinct int values"),
    (lambda: options.Edits(heads=(-1,)), "heads must be head indices >= 0"),
    (lambda: options.Edits(sites=()), "sites must be distinct str values"),
    (lambda: options.AttributionSettings("probability"), "attribute must be one of prob"),
    (lambda: options.AttributionSettings(methods=("lime",)), "methods must be distinct"),
    (lambda: options.Tolerances(max_masked_mass=float("nan")), "finite number >= 0"),
    (lambda: options.Loading(decoding="beam"), "decoding must be one of model, greedy"),
    (lambda: options.Loading(seed=1.5), "seed must be a whole number"),
    (lambda: options.AuditOptions.from_settings({"limt": 3}), r"unknown audit settings \['limt'\]"),
    (lambda: options.AuditOptions.from_settings({"quick": True, "checks_only": True}),
     "two modes"),
    (lambda: options.AuditOptions.from_settings(
        {"attribute": "logit"}, options.AuditOptions(attribution=AttributionOptions())),
     "cannot be set beside attribution="),
])
def test_a_bad_setting_is_an_option_error_naming_it(make, message):
    with pytest.raises(OptionError, match=message):
        make()


def test_loose_settings_map_into_the_options_and_leave_the_rest():
    base = options.AuditOptions(mode=options.AuditMode.QUICK, limit=4,
                                edits=options.Edits(sites=("s",), sequence_effects=True))
    # at their defaults, loose keywords leave the given options' values
    same = options.AuditOptions.from_settings(
        {"quick": False, "limit": None, "sites": None, "sequence_effects": False,
         "max_masked_mass": options.DEFAULT_MAX_MASKED_MASS}, base)
    assert same == base
    changed = options.AuditOptions.from_settings(
        {"checks_only": True, "heads": [2, 0], "limit": 7, "num_beams": 3,
         "max_masked_mass": 0.5}, base)
    assert changed == options.AuditOptions(
        mode=options.AuditMode.CHECKS, limit=7,
        edits=options.Edits(sites=("s",), heads=(2, 0), sequence_effects=True),
        tolerances=options.Tolerances(max_masked_mass=0.5),
        loading=options.Loading(num_beams=3))
    assert changed.loading.given() == {"generation": {"num_beams": 3}}
    assert changed.checks_only and not changed.quick


def test_attribution_settings_become_the_variants_options():
    settings = options.AttributionSettings("contrast", "inseq", True, ("deeplift",))
    assert attribution_options(settings) == AttributionOptions(
        "contrast", "norm", "unk", True, detach_attention=(), methods=("deeplift",))
    given = AttributionOptions(reduction="norm")
    assert attribution_options(given) is given
    assert attribution_options(None) is None
