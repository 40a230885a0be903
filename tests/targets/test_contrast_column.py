"""Contrast outputs from a third column of the data file, through the real command line, and
the --contrast file's alignment rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnaudit.attribution.methods import attribute
from attnaudit.attribution.options import AttributionOptions
from attnaudit.errors import TargetError

ROOT = Path(__file__).resolve().parents[2]
HF_MODEL = ROOT / "examples" / "date_transformer" / "model"
SOURCES = ["March 3, 2004", "12 Jan 1999"]
TARGETS = ["2004-03-03", "1999-01-12"]
FOILS = ["2004-03-04", "1999"]


def test_third_column_is_the_contrast_output(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from attnaudit.targets.hf.loading import from_hf

    data = tmp_path / "dev.tsv"  # a blank line between the examples: skipped, not shifted
    data.write_text(f"{SOURCES[0]}\t{TARGETS[0]}\t{FOILS[0]}\n\n"
                    f"{SOURCES[1]}\t{TARGETS[1]}\t{FOILS[1]}\n", encoding="utf-8")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "attnaudit", "intervene", "--hf", str(HF_MODEL), "--data",
         str(data), "--attribute", "contrast", "--target-side", "--methods", "saliency",
         "--quick", "--quiet", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr
    written = pd.read_csv(out / "attribution_prefix.csv").sort_values(["example", "step", "key"])

    target = from_hf(HF_MODEL, SOURCES, contrast=FOILS)
    batch = next(target.iter_batches())
    emitted = target.greedy(batch)
    ids = AttributionOptions(output="contrast").contrast_ids(batch, emitted, target.eos_id)
    found = attribute(target, batch, emitted, ("saliency",), output="contrast", contrast=ids,
                      target_side=True).to_frame()
    expected = found[found.side == "prefix"].sort_values(["example", "step", "key"])
    assert np.abs(expected.token_score).max() > 1e-4
    np.testing.assert_allclose(written.token_score, expected.token_score, atol=1e-6, rtol=1e-4)
    assert written[["example", "step", "key"]].values.tolist() == expected[
        ["example", "step", "key"]].values.tolist()


def test_contrast_file_and_column_rules(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from attnaudit.cli import main

    three = tmp_path / "three.tsv"
    three.write_text(f"{SOURCES[0]}\t{TARGETS[0]}\t{FOILS[0]}\n", encoding="utf-8")
    two = tmp_path / "two.tsv"
    two.write_text(f"{SOURCES[0]}\t{TARGETS[0]}\n\n{SOURCES[1]}\t{TARGETS[1]}\n",
                   encoding="utf-8")
    foils = tmp_path / "foils.txt"
    foils.write_text(f"{FOILS[0]}\n", encoding="utf-8")
    gapped = tmp_path / "gapped.txt"  # a blank line would pair FOILS[1] with no source
    gapped.write_text(f"{FOILS[0]}\n\n{FOILS[1]}\n\n", encoding="utf-8")
    cases = [
        (three, foils, "gives a contrast column and contrast outputs were given as well"),
        (two, gapped, f"--contrast {gapped}, line 2: blank"),
        (two, None, f"needs --contrast FILE or a third column (contrast) in {two}"),
    ]
    for data, contrast, message in cases:
        argv = ["intervene", "--hf", str(HF_MODEL), "--data", str(data), "--attribute",
                "contrast", "--quick", "--quiet"]
        code = main(argv + (["--contrast", str(contrast)] if contrast else []))
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err


def test_a_dataframe_third_column_is_the_contrast_output() -> None:
    transformers = pytest.importorskip("transformers")
    from attnaudit.targets.hf.loading import from_hf

    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(HF_MODEL).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(HF_MODEL)
    frame = pd.DataFrame({"source": SOURCES, "iso": TARGETS, "foil": FOILS})
    batch = next(from_hf(model, frame, tokenizer=tokenizer).iter_batches())
    foils = tokenizer(text_target=FOILS, padding=True, return_tensors="pt")
    expected = foils["input_ids"].masked_fill(foils["attention_mask"] == 0,
                                              tokenizer.eos_token_id)
    assert batch.references == TARGETS
    assert batch.inputs["contrast_ids"].tolist() == expected.tolist()
    with pytest.raises(TargetError, match="column 'foil' of the DataFrame gives a contrast "
                                          "column and contrast outputs were given as well"):
        from_hf(model, frame, tokenizer=tokenizer, contrast=FOILS)
