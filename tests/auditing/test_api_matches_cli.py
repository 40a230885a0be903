"""``attnaudit.audit`` in Python and ``attnaudit report`` on the command line are one audit:
on both bundled models they write the same CSV bytes for every seeded table, and a saved
report loads back table for table."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import attnaudit
from tests.helpers.fingerprints import assert_unchanged
from tests.helpers.timing import TIMED, load_free

# Wall times and memory: the only tables that differ from run to run.
MODELS = ["date", "date_transformer"]


@pytest.fixture(params=MODELS)
def name(request):
    if request.param == "date_transformer":
        pytest.importorskip("transformers")
    return request.param


def test_python_audit_writes_the_command_lines_csvs(name, cli_reports, api_audits,
                                                    tmp_path):
    cli = cli_reports(name)
    audit, _, _ = api_audits(name)
    audit.save(tmp_path)
    written = {p.name for p in cli.iterdir()}
    assert written == {p.name for p in tmp_path.iterdir()}
    # attention_maps.csv holds the explorer's values: the kept examples' maps, not a table.
    assert written == {"index.html", "manifest.json", "attention_maps.csv"} | \
        {f"{t}.csv" for t in audit.tables}
    assert (tmp_path / "attention_maps.csv").read_bytes() == \
        (cli / "attention_maps.csv").read_bytes()
    assert {"rows.csv", "agreement_summary.csv", "regions.csv"} <= written
    for table in set(audit.tables) - TIMED - {"checklist"}:
        assert (tmp_path / f"{table}.csv").read_bytes() == (cli / f"{table}.csv").read_bytes(), \
            table
    pd.testing.assert_frame_equal(load_free(pd.read_csv(tmp_path / "checklist.csv")),
                                  load_free(pd.read_csv(cli / "checklist.csv")))
    for table in TIMED:  # same shape, other seconds
        assert list(pd.read_csv(tmp_path / f"{table}.csv").columns) == \
            list(pd.read_csv(cli / f"{table}.csv").columns)
    ours, theirs = (json.loads((d / "manifest.json").read_text()) for d in (tmp_path, cli))
    for key in ("target", "model", "data", "seeds", "sites", "options", "thresholds",
                "tables"):
        assert ours[key] == theirs[key], key


def test_a_saved_report_loads_back_table_for_table(name, cli_reports, api_audits):
    audit, _, _ = api_audits(name)
    loaded = attnaudit.Audit.load(cli_reports(name))
    assert list(loaded.tables) == list(audit.tables)
    for table, frame in audit.tables.items():
        if table in TIMED:
            assert (loaded.tables[table].dtypes == frame.dtypes).all(), table
        elif table == "checklist":
            pd.testing.assert_frame_equal(load_free(loaded.tables[table]), load_free(frame))
        else:
            pd.testing.assert_frame_equal(loaded.tables[table], frame, obj=table)
    assert loaded.verdicts == audit.verdicts
    assert ({**loaded.statuses, "performance": None} == {**audit.statuses, "performance": None})
    assert loaded.gate().findings == audit.gate().findings


def test_the_audit_leaves_the_model_unchanged(name, api_audits):
    _, model, before = api_audits(name)
    assert_unchanged(model, before)


def test_python_intervene_writes_the_intervene_commands_tables(tmp_path):
    """``attnaudit.intervene`` is ``attnaudit intervene``: the same edited heads and the
    same CSV bytes, table for table."""
    from attnaudit.cli import main
    from attnaudit.targets.loading import load_target

    cli = tmp_path / "cli"
    assert main(["--quiet", "intervene", "--limit", "2", "--quick", "--head", "0",
                 "--out", str(cli)]) == 0
    suite = attnaudit.intervene(load_target(None), limit=2, quick=True, heads=[0],
                                progress=False)
    assert suite.metadata["edited_heads"] == [0]
    api = tmp_path / "api"
    written = {p.name for p in suite.write_csv(api)}
    assert written == {p.name for p in cli.iterdir()} - {"manifest.json"}
    for name in written:
        assert (api / name).read_bytes() == (cli / name).read_bytes(), name
    manifest = json.loads((cli / "manifest.json").read_text())
    assert manifest["metadata"]["edited_heads"] == [0]
    with pytest.raises(attnaudit.TargetError, match="intervene runs the intervention suite"):
        attnaudit.intervene(load_target(None), options=attnaudit.AuditOptions(mode="checks"))


def test_the_edited_sites_and_heads_of_an_audit_are_recorded():
    from attnaudit.options import AuditOptions, Edits
    from attnaudit.targets.loading import load_target

    target = load_target(None)
    given = attnaudit.audit(target, limit=1, interventions=False, progress=False,
                            heads=[1, 0], sites=["attend:cross"])
    assert given.manifest["options"] == {"quick": False, "limit": 1, "explorer_examples": 5,
                                         "sites": ["attend:cross"], "heads": [1, 0]}
    same = attnaudit.audit(target, options=AuditOptions(
        limit=1, interventions=False, edits=Edits(sites=("attend:cross",), heads=(1, 0))),
        progress=False)
    assert same.manifest["options"] == given.manifest["options"]
