"""The suite on the committed date models, at a small limit."""

import pytest

from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.cli.app import build_parser
from attnaudit.cli.commands import intervene_command
from attnaudit.interventions.protocols import QUICK_RANDOM_DRAWS
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint


def _check_suite(suite, n_examples, values_reachable):
    tables = suite.tables
    assert suite.metadata["examples"] == n_examples
    rows = tables["rows"]
    for column in ("perm_median_tvd", "uniform_tvd", "value_zero_tvd"):
        assert rows[column].between(0, 1).all(), column
    assert not tables["summary"]["value"].isna().any()
    assert tables["permutation_bins"]["n"].iloc[:4].sum() == len(rows)
    # another example's value: a value edit where capture holds the values (SDPA)
    status = tables["value_controls"].set_index("control")["status"]
    other = {"run"} if values_reachable else {"not reachable"}
    assert set(status[["other_example", "other_example_random"]]) == other
    assert set(status.drop(["other_example", "other_example_random"])) == {"run"}


def test_date_model_small_run(tmp_path):
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=3)
    before = model_fingerprint(target.model)
    suite = run_suite(target, quick=True, progress=False, n_permutations=5,
                      cumulative_examples=1)
    _check_suite(suite, 3, values_reachable=False)
    assert suite.metadata["sites"] == ["attend:cross"]
    # a quick audit's cumulative test draws QUICK_RANDOM_DRAWS random orders per row
    cumulative = suite.tables["cumulative"]
    random = cumulative[cumulative["order"] == "random"]
    assert suite.metadata["cumulative_random_draws"] == QUICK_RANDOM_DRAWS == 2
    assert sorted(random["draw"].unique()) == [1, 2]
    assert len(random) == 2 * len(cumulative[cumulative["order"] == "attention"]) > 0
    assert_unchanged(target.model, before)
    paths = suite.write_csv(tmp_path)
    assert (tmp_path / "summary.csv") in paths


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_date_transformer_small_run():
    pytest.importorskip("transformers")
    from attnaudit_examples.date_transformer.target import make_target

    target = make_target()
    before = model_fingerprint(target.model)
    suite = run_suite(target, quick=True, limit=2, progress=False, n_permutations=4,
                      cumulative_examples=1)
    _check_suite(suite, 2, values_reachable=True)
    assert len(suite.metadata["sites"]) == 2 and all(
        s.endswith(":cross") for s in suite.metadata["sites"])
    assert suite.metadata["heads"] == {s: 4 for s in suite.metadata["sites"]}
    assert_unchanged(target.model, before)


def test_intervene_command_prints_and_writes(tmp_path, capsys):
    args = build_parser().parse_args(["intervene", "--limit", "2", "--out", str(tmp_path),
                                      "--quick"])
    assert intervene_command(args) == 0
    out = capsys.readouterr().out
    assert "Jain & Wallace" in out and "perm_median_tvd" in out
    assert (tmp_path / "rows.csv").exists()
