"""Bad protocols and faithfulness settings: a protocol the suite could not read is refused
when it is registered (an InterventionError naming the attribute), never at the first
audit as an AttributeError; the registry is left as it was; removal fractions the curves
cannot use are refused by name."""

from __future__ import annotations

from typing import Any, ClassVar

import pandas as pd
import pytest

from attnaudit.errors import InterventionError
from attnaudit.interventions import (
    BatchContext,
    InterventionProtocol,
    register_protocol,
    registered_protocols,
    unregister_protocol,
)
from attnaudit.interventions.faithfulness import FRACTIONS, bin_sizes, check_fractions
from attnaudit.interventions.protocol import ROWS


class _Runs(InterventionProtocol):
    name: ClassVar[str] = "bad_input_probe"
    columns: ClassVar[Any] = {ROWS: ("probe_tvd",)}

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        return {}


def _with(**attributes: Any) -> type[InterventionProtocol]:
    return type("Probe", (_Runs,), attributes)


class _NoRun(InterventionProtocol):
    name: ClassVar[str] = "no_run"
    columns: ClassVar[Any] = {}


class _NeedsArgument(_Runs):
    def __init__(self, strength: float) -> None:
        self.strength = strength


@pytest.mark.parametrize(("protocol", "message"), [
    (_with(name=None), "protocol Probe must set name to a non-empty str, got None"),
    (_with(name=""), "must set name to a non-empty str, got ''"),
    (_with(name=3), "must set name to a non-empty str, got 3"),
    (_with(columns=None), "'bad_input_probe': columns must map table names to tuples"),
    (_with(columns={ROWS: "probe_tvd"}), "columns must map table names to tuples"),
    (_with(scope="all rows"), "scope must be one of 'every counted row'"),
    (_with(modes=frozenset({"fast"})), "modes must be a set among full, quick"),
    (_with(modes="quick"), "modes must be a set among full, quick"),
    (_with(after="uniform"), "after must be a tuple of names, got 'uniform'"),
    (_with(row_tables=[ROWS]), "row_tables must be a tuple of names"),
    (_NoRun, r"cannot make a _NoRun with no arguments \(Can't instantiate abstract class"),
    (_NeedsArgument, "cannot make a _NeedsArgument with no arguments"),
    (pd.DataFrame, "takes an InterventionProtocol, got the class DataFrame"),
    ("uniform", "takes an InterventionProtocol, got str"),
])
def test_a_malformed_protocol_is_refused_at_registration(protocol, message):
    before = registered_protocols()
    with pytest.raises(InterventionError, match=message):
        register_protocol(protocol)
    assert registered_protocols() == before


def test_duplicates_and_unknown_names_are_refused_and_leave_the_registry():
    before = registered_protocols()
    with pytest.raises(InterventionError, match="a protocol named 'uniform' is registered"):
        register_protocol(_with(name="uniform"))
    with pytest.raises(InterventionError, match=r"no protocol named 'nope' is registered; "
                                                r"registered: \['permutation'"):
        unregister_protocol("nope")
    assert registered_protocols() == before


def test_a_well_formed_protocol_still_registers_by_class_or_instance():
    for protocol in (_Runs, _Runs()):
        register_protocol(protocol)
        try:
            assert registered_protocols()[-1].name == "bad_input_probe"
        finally:
            unregister_protocol("bad_input_probe")


@pytest.mark.parametrize("fractions", [(), (0,), (-5,), (150,), (50, 10), (10, 10),
                                       (float("nan"),), (True,), ("10",)])
def test_removal_fractions_outside_the_percent_range_or_out_of_order_are_refused(fractions):
    with pytest.raises(InterventionError, match=r"removal fractions must be increasing, "
                                                r"distinct percentages in \(0, 100\]"):
        bin_sizes(10, fractions)


def test_the_default_and_edge_fractions_are_taken():
    check_fractions(FRACTIONS)
    assert bin_sizes(10, (0.5, 100)) == [1, 10]  # at least one key, at most every key
