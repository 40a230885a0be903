"""``attnaudit check`` as CI runs it: a subprocess from the repository root, every exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import attnaudit.cli
from tests.helpers.toys.masking_reference import toy_rows

ROOT = Path(__file__).resolve().parents[2]


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnaudit.cli", "check", *args], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=300)


@pytest.fixture
def toy_file(tmp_path: Path) -> Path:
    """A target file naming the toy factories, as a user would write one."""
    path = tmp_path / "toy target.py"
    path.write_text("from tests.helpers.toys.masking import after_softmax, nan_on_empty_source, "
                    "zero_fill\n")
    return path


def test_bundled_date_model_is_healthy():
    result = check("--limit", "10")
    assert result.returncode == 0, result.stderr
    assert "healthy" in result.stdout and "10 examples" in result.stdout
    assert "audit date: validity: 0/10 examples" in result.stderr  # progress on stderr only
    assert "examples [" not in result.stdout


def test_mask_after_softmax_fails_with_json_and_junit(toy_file, tmp_path):
    junit = tmp_path / "reports" / "check.xml"
    junit.parent.mkdir()
    result = check(f"{toy_file}:after_softmax", "--json", "--junit", str(junit))
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)
    leaky, _ = toy_rows("after_softmax")
    assert payload["healthy"] is False and payload["exit_code"] == 1
    assert payload["failing_sites"] == ["attend:cross"]
    [masked] = [f for f in payload["findings"] if f["check"] == "masked_mass"]
    assert (masked["status"], masked["rows"]) == ("fail", leaky)
    suites = ET.parse(junit).getroot()
    cases = suites.findall("./testsuite/testcase")
    assert len(cases) == len(payload["findings"])
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("attnaudit.toy_after_softmax.attend:cross", "masked_mass")]
    assert suites.get("failures") == "1"


def test_zero_filled_scores_fail_naming_site_and_rows(toy_file):
    result = check(f"{toy_file}:zero_fill")
    assert result.returncode == 1, result.stderr
    leaky, total = toy_rows("zero_fill")
    assert leaky > 0
    assert f"FAIL  attend:cross  masked_mass: {leaky} of {total} rows" in result.stdout
    assert "FAILED: 1 of 1 site(s) failing: attend:cross" in result.stdout


def test_nan_on_all_masked_row_fails(toy_file):
    result = check(f"{toy_file}:nan_on_empty_source")
    assert result.returncode == 1, result.stderr
    nan_rows, _ = toy_rows("correct", empty_source=True)
    assert nan_rows > 0
    assert f"FAIL  attend:cross  all_masked_nan: {nan_rows} rows" in result.stdout
    assert f"FAIL  attend:cross  non_finite: {nan_rows} of" in result.stdout


def test_bad_target_spec_exits_2():
    result = check("no_colon_here")
    assert result.returncode == 2
    assert "TARGET must look like package.module:factory" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_hf_checkpoint_with_tsv_is_healthy():
    pytest.importorskip("transformers")
    result = check("--hf", "examples/date_transformer/model", "--data",
                   "examples/date_transformer/audit.tsv", "--limit", "20", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["examples"] == 20 and payload["healthy"]
    sites = {s["site"]: s for s in payload["sites"]}
    assert len(sites) == 6
    assert sites["model.encoder.layers.0.self_attn:self"]["role"] == "encoder_self"
    assert sites["model.decoder.layers.1.self_attn:self"]["eligibility"] == "declared: causal"
    assert sites["model.decoder.layers.1.encoder_attn:cross"]["role"] == "cross"
    assert all(s["scores_materialised_by_capture"] and s["mechanism"] == "sdpa"
               for s in sites.values())


# In-process: the same entry point, without another interpreter start.

@pytest.mark.parametrize(("args", "message"), [
    (["missing/target.py:make"], "target file not found: missing/target.py"),
    (["--hf", "examples/date_transformer/model"], "--hf DIR needs --data FILE.tsv"),
    (["--hf", "no/such/dir", "--data", "x.tsv"], "model directory not found: no/such/dir"),
    (["--hf", "examples/date_transformer/model", "--data", "no/such.tsv"],
     "data file not found: no/such.tsv"),
])
def test_loading_errors_exit_2(args, message, capsys):
    assert attnaudit.cli.main(["check", *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""

def test_factory_returning_a_wrong_type_exits_2(toy_file, capsys):
    toy_file.write_text(toy_file.read_text() + "def wrong():\n    return 42\n")
    assert attnaudit.cli.main(["check", f"{toy_file}:wrong"]) == 2
    assert "returned int, not a Seq2SeqTarget" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "prog", "message"), [
    (["check", "--limit", "many"], "attnaudit check",
     "argument --limit: expected a whole number, got 'many'"),
    (["check", "--limit", "0"], "attnaudit check", "argument --limit: must be at least 1, got 0"),
    (["check", "--bogus"], "attnaudit", "unrecognized arguments: --bogus"),
])
def test_argparse_usage_errors_exit_2_in_one_line(argv, prog, message, capsys):
    with pytest.raises(SystemExit) as stop:
        attnaudit.cli.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"{prog}: error: {message} (see {prog} --help)\n"


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--max-masked-mass", "-1", "--max-masked-mass must be a finite number >= 0"),
    ("--row-sum-tolerance", "nan", "--row-sum-tolerance must be a finite number >= 0"),
])
def test_bad_option_values_exit_2(option, value, message, capsys):
    assert attnaudit.cli.main(["check", option, value]) == 2
    assert message in capsys.readouterr().err


def test_unwritable_junit_path_exits_2(toy_file, tmp_path, capsys):
    missing_dir = tmp_path / "no such dir" / "x.xml"
    assert attnaudit.cli.main(["check", f"{toy_file}:zero_fill", "--junit",
                               str(missing_dir)]) == 2
    err = capsys.readouterr().err
    assert "cannot write JUnit XML" in err and "does not exist" in err
    assert "audit toy_zero_fill" not in err  # refused before the audit ran
    for path in ("", str(tmp_path)):
        assert attnaudit.cli.main(["check", f"{toy_file}:zero_fill", "--junit", path]) == 2
        assert "cannot write JUnit XML" in capsys.readouterr().err


def test_max_masked_mass_option_sets_the_line(toy_file, capsys):
    worst = toy_rows("zero_fill", worst=True)  # largest leaked mass, computed independently
    spec = f"{toy_file}:zero_fill"
    assert attnaudit.cli.main(["check", spec, "--max-masked-mass", repr(worst * 1.001)]) == 0
    assert "healthy" in capsys.readouterr().out
    assert attnaudit.cli.main(["check", spec, "--max-masked-mass", repr(worst * 0.999)]) == 1
    assert "masked_mass: 1 of" in capsys.readouterr().out


def test_the_loading_flags_make_the_target_and_are_not_given_to_it_again(capsys):
    """--batch-size, --num-beams ... go to from_hf; the audit of the target it returns does
    not see them again (an audit of a ready target refuses from_hf options)."""
    pytest.importorskip("transformers")
    code = attnaudit.cli.main(["--quiet", "check", "--hf", "examples/date_transformer/model",
                               "--data", "examples/date_transformer/audit.tsv", "--limit",
                               "3", "--batch-size", "2", "--num-beams", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["examples"] == 3
