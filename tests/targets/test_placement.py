"""Device, dtype and size knobs reach the model; over-long sources are truncated, with a
warning and a record in the report; a bfloat16 report runs end to end."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import attnaudit.cli
import attnaudit.cli.app
import attnaudit.cli.loading
from attnaudit.errors import TargetError
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.placement import place

ROOT = Path(__file__).resolve().parents[2]
DATE_BART = ROOT / "examples" / "date_transformer" / "model"
AUDIT_TSV = ROOT / "examples" / "date_transformer" / "audit.tsv"


def _cli_target(*argv: str):
    args = attnaudit.cli.app.build_parser().parse_args(["check", *argv])
    return attnaudit.cli.loading.load_cli_target(args)


def _dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters() if p.is_floating_point()}


def test_device_and_dtype_reach_the_bundled_model():
    target = _cli_target("--device", "meta", "--dtype", "bfloat16")
    assert {p.device.type for p in target.model.parameters()} == {"meta"}
    assert _dtypes(target.model) == {torch.bfloat16}
    assert next(target.iter_batches(2)).source_ids.device.type == "meta"


def test_device_and_dtype_reach_a_hugging_face_model():
    pytest.importorskip("transformers")
    target = _cli_target("--hf", str(DATE_BART), "--data", str(AUDIT_TSV), "--device", "meta",
                         "--batch-size", "3")
    assert {p.device.type for p in target.model.parameters()} == {"meta"}
    batch = next(target.iter_batches())
    assert len(batch) == 3 and batch.source_ids.device.type == "meta"
    target = from_hf(DATE_BART, ["2001-02-03"], dtype="bfloat16", device="cpu")
    assert _dtypes(target.model) == {torch.bfloat16}


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "warp:9"], "unknown device 'warp:9'"),
    (["--batch-size", "4"], "--batch-size goes with --hf DIR"),
    pytest.param(["--device", "cuda:0"], "device 'cuda:0': CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")),
])
def test_bad_knobs_exit_2_with_a_clear_message(argv, message, capsys):
    assert attnaudit.cli.main(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_max_new_tokens_bounds_greedy_decoding():
    pytest.importorskip("transformers")
    target = _cli_target("--hf", str(DATE_BART), "--data", str(AUDIT_TSV),
                         "--max-new-tokens", "3")
    batch = next(target.iter_batches(2))
    assert target.greedy(batch).shape[1] <= 3


def test_over_long_sources_are_truncated_with_a_warning_and_reported():
    pytest.importorskip("transformers")
    from attnaudit.checklist import build_checklist
    from attnaudit.validity.pipeline import run_validity_audit

    limit = 64  # the checkpoint's max_position_embeddings
    sources = ["3 March 2001", "x" * 200, "y" * 65, "April 4, 1999"]
    with pytest.warns(UserWarning, match=f"2 of 4 sources were longer than {limit} tokens"):
        target = from_hf(DATE_BART, sources, max_new_tokens=4)
    assert all(b.source_ids.shape[1] <= limit for b in target.iter_batches())
    audit = run_validity_audit(target, progress=False, timing=False)  # no crash
    positions = next(i for i in build_checklist(target.model, audit, None).items
                     if i.item.key == "positions")
    assert any("2 of 4 sources were longer than 64 tokens" in line
               for line in positions.observations)
    with pytest.warns(UserWarning, match="1 of 2 sources were longer than 5 tokens"):
        short = from_hf(DATE_BART, ["abc", "abcdefgh"], max_source_tokens=5)
    assert next(short.iter_batches()).source_ids.shape[1] == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "no source was truncated" in from_hf(DATE_BART, ["abc"]).truncation


def test_bad_from_hf_options_raise_target_errors():
    pytest.importorskip("transformers")
    with pytest.raises(TargetError, match="unsupported dtype 'float8'"):
        from_hf(DATE_BART, ["abc"], dtype="float8")
    with pytest.raises(TargetError, match="max_source_tokens must be a positive integer"):
        from_hf(DATE_BART, ["abc"], max_source_tokens=0)


def test_place_without_options_leaves_the_target_alone():
    from attnaudit_examples.date.target import make_target

    target = make_target(limit=2)
    assert place(target) is target and _dtypes(target.model) == {torch.float32}


def test_bfloat16_report_of_a_saved_hf_model_runs_end_to_end(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    saved = tmp_path / "bart"
    AutoModelForSeq2SeqLM.from_pretrained(DATE_BART).save_pretrained(saved)
    AutoTokenizer.from_pretrained(DATE_BART).save_pretrained(saved)
    data = tmp_path / "dev.tsv"
    data.write_text("".join(AUDIT_TSV.read_text().splitlines(keepends=True)[:2]))
    out = tmp_path / "report"
    status = attnaudit.cli.main(["report", "--hf", str(saved), "--data", str(data), "--dtype",
                                 "bfloat16", "--quick", "--out", str(out),
                                 "--max-memory", "64MiB", "--limit", "1"])
    assert status == 0
    page = (out / "index.html").read_text()
    assert "--dtype bfloat16" in page and "no source was truncated" in page
    assert "could not run" not in page  # interventions and attributions ran in bfloat16
    for table in ("permutation_bins", "agreement_summary", "sites"):
        assert (out / f"{table}.csv").stat().st_size > 0
    assert "bfloat16" in (out / "sites.csv").read_text()
