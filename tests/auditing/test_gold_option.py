"""``--gold FILE`` on ``attnaudit report`` (``gold=`` on :func:`attnaudit.audit`): any
model's report gets the alignment error rate table, scored against the file, which is
checked against the data first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import attnaudit
from attnaudit.errors import AlignmentError, OptionError
from attnaudit.options import AuditOptions
from attnaudit.targets.contract import Batch
from tests.helpers.date_bart_eager import eager_cross_attention
from tests.helpers.report_page import read_page

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "date_transformer" / "model"
DATA = ROOT / "examples" / "date_transformer" / "audit.tsv"
GOLD = ROOT / "examples" / "date" / "audit.gold"
N = 4


def hand_aer(predicted: list[set[tuple[int, int]]], lines: list[str]) -> float:
    """Och & Ney's AER, 1 - (|A∩S| + |A∩P|) / (|A| + |S|), counted from the raw lines
    (``i-j`` sure, ``i-pj`` possible; every sure link possible too)."""
    a_s = a_p = n_a = n_s = 0
    for links, line in zip(predicted, lines, strict=True):
        sure, possible = set(), set()
        for token in line.split():
            source, _, out = token.partition("-")
            link = (int(source), int(out.removeprefix("p")))
            possible.add(link)
            if not out.startswith("p"):
                sure.add(link)
        a_s, a_p = a_s + len(links & sure), a_p + len(links & possible)
        n_a, n_s = n_a + len(links), n_s + len(sure)
    return 1 - (a_s + a_p) / (n_a + n_s)


def eager_links() -> list[set[tuple[int, int]]]:
    """Per example, (eligible source token, output token) at the argmax of the eager
    cross-attention's mean over layers and heads, read at the step that emits the token;
    decoded by Hugging Face's generate with the model's generation config."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(MODEL)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(MODEL).eval()
    texts = [line.split("\t")[0] for line in DATA.read_text(encoding="utf-8").splitlines()[:N]]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        emitted = model.generate(**enc)[:, 1:]  # after the decoder start token
    batch = Batch(enc["input_ids"], enc["attention_mask"].bool(), texts)
    mean = eager_cross_attention(batch, emitted)  # (B, T, S)
    special = torch.tensor(tokenizer.all_special_ids)
    found = []
    for b in range(N):
        keys = (batch.source_mask[b] & ~torch.isin(batch.source_ids[b], special)).nonzero()[:, 0]
        ids = emitted[b].tolist()
        n_out = ids.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in ids else len(ids)
        found.append({(int(mean[b, j, keys].argmax()), j) for j in range(n_out)})
    return found


@pytest.fixture(scope="module")
def gold_report(tmp_path_factory) -> Path:
    """The quick report of the date BART from its folder (a subprocess), two batches."""
    out = tmp_path_factory.mktemp("gold_report")
    argv = [sys.executable, "-m", "attnaudit.cli", "--quiet", "report", "--quick", "--hf",
            str(MODEL), "--data", str(DATA), "--gold", str(GOLD), "--limit", str(N),
            "--batch-size", "2",  # the second batch reads lines 3 and 4
            "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_an_hf_report_scores_the_gold_file_as_a_hand_count_of_eager_attention(gold_report):
    table = pd.read_csv(gold_report / "alignment_aer.csv").set_index(["measure", "convention"])
    lines = GOLD.read_text(encoding="utf-8").splitlines()[:N]
    expected = hand_aer(eager_links(), lines)
    assert table.loc[("weights", "emit"), "aer"] == pytest.approx(expected, abs=1e-9)
    assert table.loc[("weights", "emit"), "sentences"] == N
    assert any(t.csv == "alignment_aer.csv" for t in read_page(gold_report / "index.html").tables)
    manifest = json.loads((gold_report / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["options"]["gold"] == str(GOLD)
    assert "--gold" in manifest["command_line"]


def _gold(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "gold.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_gold_file_shorter_than_the_data_is_refused_before_the_audit(tmp_path):
    short = _gold(tmp_path, GOLD.read_text(encoding="utf-8").splitlines()[:3])
    with pytest.raises(AlignmentError, match=r"has 3 lines but the data has 400 examples"):
        attnaudit.audit(MODEL, data=DATA, gold=short, progress=False)
    with pytest.raises(AlignmentError, match=r"has 3 lines but the audit reads 4 examples "
                                             r"\(limit 4\)"):
        attnaudit.audit(MODEL, data=DATA, gold=short, limit=N, progress=False)


def test_a_link_past_the_source_names_its_line(tmp_path):
    lines = GOLD.read_text(encoding="utf-8").splitlines()[:N]
    lines[1] = "99-0 " + lines[1]  # example 2 ("august 22, 2004") has 15 characters
    with pytest.raises(AlignmentError, match=r"gold\.txt, line 2: source token 99 but "
                                             r"example 2 \('august 22, 2004'\) has 15"):
        attnaudit.audit(MODEL, data=DATA, gold=_gold(tmp_path, lines), limit=N,
                        progress=False)
    lines[1] = "0:1"
    with pytest.raises(AlignmentError, match=r"gold\.txt, line 2: '0:1' is not a link"):
        attnaudit.audit(MODEL, data=DATA, gold=_gold(tmp_path, lines), limit=N,
                        progress=False)


def test_gold_is_a_path_option():
    assert AuditOptions(gold=GOLD).gold == str(GOLD)
    with pytest.raises(OptionError, match=r"^gold must be the path of a Pharaoh file"):
        AuditOptions(gold=3)


def test_a_bad_gold_file_is_a_user_error_on_the_command_line(tmp_path):
    bad = _gold(tmp_path, ["0-0", "1-x"])
    argv = [sys.executable, "-m", "attnaudit.cli", "--quiet", "report", "--quick", "--hf",
            str(MODEL), "--data", str(DATA), "--gold", str(bad), "--limit", "2", "--out",
            str(tmp_path / "out")]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False,
                            timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "gold.txt, line 2: '1-x' is not a link" in result.stderr
    assert not (tmp_path / "out").exists()
