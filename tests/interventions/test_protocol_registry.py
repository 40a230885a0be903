"""A protocol joins the suite by one class and one registration: registered here (this file
only), it runs in the suite, gets its progress counter, its columns in ``rows``, its own
table and CSV, its summary row, its metadata, its checklist line and the contract checks;
unregistered, it is gone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd
import pytest

from attnaudit.auditing import intervention_suite
from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.checklist import build_checklist
from attnaudit.errors import InterventionError
from attnaudit.interventions import (
    BatchContext,
    InterventionProtocol,
    SuiteSettings,
    register_protocol,
    registered_protocols,
    unregister_protocol,
)
from attnaudit.interventions.protocol import ROWS, Columns
from attnaudit.interventions.runner import ItemEdit, row_columns, run_items
from tests.helpers.toys.masking import make_target
from tests.interventions.test_protocol_contract import (
    check_failing_midway,
    check_no_degenerate_row,
    contract_protocols,
)

NOTE = "every edited row given back its own weights"


class IdentityEdit(InterventionProtocol):
    """Edit every counted row with its own weights: the output cannot change (TVD 0 up to
    rounding), so any change it reports is the runner's."""

    name: ClassVar[str] = "identity"
    columns: ClassVar[Columns] = {ROWS: ("identity_tvd", "identity_flip"),
                                  "identity_batches": ("first_example", "rows")}

    def run(self, ctx: BatchContext) -> dict[str, pd.DataFrame]:
        change = run_items(ctx.target, ctx.ref, ctx.rows.example, ctx.rows.step,
                           ItemEdit(lambda old: old))
        assert ctx.facts is not None
        ctx.facts["batches"] = ctx.facts.get("batches", 0) + 1
        return {ROWS: pd.DataFrame({**row_columns(ctx.ref, ctx.rows),
                                    "identity_tvd": change.tvd.numpy(),
                                    "identity_flip": change.flip.numpy()}),
                "identity_batches": pd.DataFrame({"first_example": [ctx.ref.first_example],
                                                  "rows": [len(ctx.rows)]})}

    def summary(self, tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, float, int, str]]:
        rows = tables[ROWS]
        return [("identity_tvd_max", float(rows["identity_tvd"].max()), len(rows), NOTE)]

    def checklist_lines(self, tables: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
        if "identity_tvd" not in tables.get(ROWS, pd.DataFrame()):
            return []
        return [(f"Identity edit: largest TVD {tables[ROWS]['identity_tvd'].max():.1g}.", "")]

    def metadata(self, settings: SuiteSettings, examples: set[int] | None,
                 facts: Mapping[str, Any]) -> dict[str, object]:
        return {"identity_note": NOTE}


@pytest.fixture
def registered():
    register_protocol(IdentityEdit)
    try:
        yield
    finally:
        unregister_protocol("identity")


def test_a_registered_protocol_reaches_the_suite_tables_checklist_and_contract(
        registered, monkeypatch, tmp_path):
    splits: list[int] = []
    split = intervention_suite.split
    monkeypatch.setattr(intervention_suite, "split",
                        lambda units, parts: (splits.append(parts), split(units, parts))[1])
    target = make_target("correct")
    suite = run_suite(target, quick=True, progress=False, n_permutations=2)

    assert suite.metadata["protocols"][-1] == "identity"
    assert suite.metadata["identity_note"] == NOTE
    # quick: permutation, uniform, zeroing, values, cumulative, 2 attribution counters,
    # faithfulness, its own
    assert splits and set(splits) == {9}
    rows = suite.tables["rows"]
    assert {"perm_median_tvd", "uniform_tvd", "identity_tvd", "identity_flip"} <= set(rows)
    assert rows["identity_tvd"].notna().all() and (rows["identity_tvd"] < 1e-5).all()
    assert not rows["identity_flip"].any()
    batches = suite.tables["identity_batches"]
    assert batches["first_example"].tolist() == [0, 3] and batches["rows"].sum() == len(rows)
    summary = suite.tables["summary"].set_index("metric")
    assert summary.loc["identity_tvd_max", "n"] == len(rows)
    assert (tmp_path / "identity_batches.csv") in suite.write_csv(tmp_path)

    item = build_checklist(target.model, None, suite).item("interventions")
    assert any(line.startswith("Identity edit: largest TVD") for line in item.observations)
    assert "identity_batches" in {e.name for e in item.evidence}

    assert "identity" in contract_protocols()
    check_failing_midway(contract_protocols()["identity"], target)
    check_no_degenerate_row(contract_protocols()["identity"])


def test_an_unregistered_protocol_is_gone():
    register_protocol(IdentityEdit)
    assert unregister_protocol("identity").name == "identity"
    assert "identity" not in {p.name for p in registered_protocols()}
    with pytest.raises(InterventionError, match="no protocol named 'identity'"):
        unregister_protocol("identity")


def test_a_name_is_registered_once():
    with pytest.raises(InterventionError, match="registered already"):
        register_protocol(type("Again", (IdentityEdit,), {"name": "permutation"}))
    with pytest.raises(InterventionError, match="takes an InterventionProtocol"):
        register_protocol(object())  # type: ignore[type-var]


def test_a_protocol_runs_after_those_it_names():
    class First(IdentityEdit):
        name: ClassVar[str] = "first"
        after: ClassVar[tuple[str, ...]] = ("second",)

    class Second(IdentityEdit):
        name: ClassVar[str] = "second"

    register_protocol(First)
    register_protocol(Second)
    try:
        names = [p.name for p in registered_protocols()]
        assert names.index("second") < names.index("first")
        assert names.index("permutation") < names.index("sequence_effects")
    finally:
        unregister_protocol("first")
        unregister_protocol("second")
