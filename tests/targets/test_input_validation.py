"""Bad input refused where it enters, naming the thing, the place and the fix: data files,
tokenizer folders, what a target's callables return, sources beyond the position limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.errors import DataFileError, TargetError, TokenizerError
from attnaudit.targets.checks import position_limit
from attnaudit.targets.datafile import DataRows, read_rows
from attnaudit.validity.pipeline import run_validity_audit
from tests.helpers.toys.masking import DIM, PAD, ToySeq2Seq, make_target

ROOT = Path(__file__).resolve().parents[2]
HF_MODEL = ROOT / "examples" / "date_transformer" / "model"
HF_DATA = ROOT / "examples" / "date_transformer" / "audit.tsv"


def attnaudit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnaudit", *args], cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


# Data files: each broken the way a user's file breaks, the file and line named.

@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty: expected source[<TAB>target] lines"),
    (b"\n  \n", "is empty"),
    (b"March 3, 2001\n\xff\xfebinary\n", "line 2: not UTF-8 (byte 0xff at column 1)"),
    (b"ok line\nMai 3, 2001 caf\xe9\n", "line 2: not UTF-8 (byte 0xe9 at column 16)"),
    (b"ok\n\nPK\x03\x04\x00\x00zip\n", "line 3: binary data (a NUL byte at column 5)"),
    (b"a\tb\tc\td\n", "line 1: 4 tab-separated columns"),
    (b"a\tb\tc\nd\te\n", "line 1 gives a contrast (third column) but line 2 does not"),
    (b"a\tb\tc\nd\te\t \n", "line 2: the contrast (third column) is empty"),
    (b"a\tb\n\tc\n", "line 2: the source (first column) is empty"),
    (b"a\tA\nb\nc\tC\n", "line 1 gives a target (source<TAB>target) but line 2 does not"),
])
def test_broken_data_files_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "dev.tsv"
    path.write_bytes(content)
    with pytest.raises(DataFileError) as error:
        read_rows(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_good_data_file_reads_sources_and_targets(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_bytes(b"March 3, 2001\t2001-03-03\r\n\n3/4/99\t1999-03-04\n")
    assert read_rows(path) == DataRows(["March 3, 2001", "3/4/99"],
                                       ["2001-03-03", "1999-03-04"], None, (2,))
    path.write_text("only sources\nhere\n")
    assert read_rows(path) == DataRows(["only sources", "here"], None, None)
    path.write_text("a\tA\tB\n\nb\t\tC\n")  # a blank line, an empty target
    assert read_rows(path) == DataRows(["a", "b"], ["A", ""], ["B", "C"], (2,))
    with pytest.raises(DataFileError, match="is not a file"):
        read_rows(tmp_path)


def test_binary_data_file_through_the_cli(tmp_path):
    pytest.importorskip("transformers")
    data = tmp_path / "dev.tsv"
    data.write_bytes(b"March 3, 2001\n\x00\x01\x02\n")
    result = attnaudit("check", "--hf", str(HF_MODEL), "--data", str(data))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{data}, line 2: binary data" in result.stderr


# Tokenizers: a folder without one, and one that does not know the text.

def test_checkpoint_without_tokenizer_files_is_refused_not_healthy(tmp_path):
    pytest.importorskip("transformers")
    bare = tmp_path / "checkpoint"
    bare.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(HF_MODEL / name, bare / name)
    result = attnaudit("check", "--hf", str(bare), "--data", str(HF_DATA), "--limit", "3")
    assert result.returncode == 2, result.stdout
    assert "healthy" not in result.stdout and "Traceback" not in result.stderr
    assert f"{bare} has no tokenizer files" in result.stderr


def test_tokenizer_that_turns_every_source_into_special_tokens_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from attnaudit.targets.hf.loading import from_hf

    data = tmp_path / "other script.tsv"
    data.write_text("日本語\n中文\n", encoding="utf-8")  # the character tokenizer knows neither
    with pytest.raises(TokenizerError, match="turns every source into special tokens only"):
        from_hf(HF_MODEL, data)
    data.write_text("日本語\nMarch 3, 2001\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="1 of 2 sources into special tokens only"):
        from_hf(HF_MODEL, data)


# Target callables: wrong shapes and dtypes named with the callable.

def _broken(what: str):
    target = make_target("correct")
    greedy, forced = target.greedy, target.teacher_forced
    changes = {
        "teacher_forced (B, T)": {"teacher_forced": lambda b, e: forced(b, e).argmax(-1).float()},
        "greedy float": {"greedy": lambda b: greedy(b).float()},
        "greedy rows": {"greedy": lambda b: greedy(b)[:1]},
        "greedy negative": {"greedy": lambda b: greedy(b) - 10},
        "teacher_forced ids": {"teacher_forced": lambda b, e: forced(b, e).argmax(-1, True)},
    }[what]
    return target.with_options(**changes)


@pytest.mark.parametrize(("what", "message"), [
    ("teacher_forced (B, T)", "teacher_forced must return floating logits (batch, steps, vocab)"
                              " = (3, 4) + (V,), got torch.float32 (3, 4)"),
    ("teacher_forced ids", "teacher_forced must return floating logits"),
    ("greedy float", "greedy must return integer ids of shape (batch=3, steps), got "
                     "torch.float32 (3, 4)"),
    ("greedy rows", "greedy must return integer ids of shape (batch=3, steps), got "
                    "torch.int64 (1, 4)"),
    ("greedy negative", "greedy returned negative token ids"),
])
def test_target_outputs_are_checked_by_audit_and_suite(what, message):
    for run in (lambda t: run_validity_audit(t, progress=False),
                lambda t: run_suite(t, quick=True, progress=False, n_permutations=2)):
        with pytest.raises(TargetError) as error:
            run(_broken(what))
        assert message in str(error.value)
        assert "target 'toy_correct'" in str(error.value)


def test_logits_of_shape_b_t_fail_the_gate_not_pass_it(tmp_path):
    spec = tmp_path / "target.py"
    spec.write_text("from tests.targets.test_input_validation import _broken\n"
                    "def make():\n    return _broken('teacher_forced (B, T)')\n")
    result = attnaudit("check", f"{spec}:make")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "healthy" not in result.stdout
    assert "teacher_forced must return floating logits" in result.stderr


# Sources longer than the model's position table.

class PositionedToy(ToySeq2Seq):
    """The toy with learned source positions: a table of 4 rows."""

    def __init__(self) -> None:
        super().__init__("correct")
        self.pos_embed = nn.Embedding(4, DIM)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        keys = self.src_embed(src) + self.pos_embed(torch.arange(src.shape[1]))
        queries = self.tgt_embed(tgt_in)
        return self.out(self.attend(queries, keys, src != PAD) + queries)


def test_source_beyond_the_position_limit_is_a_clear_error_not_an_index_error():
    model = PositionedToy()
    assert position_limit(model) == (4, "pos_embed")
    target = make_target("correct", ([3, 4], [5, 3, 6, 7, 4]), batch_size=1)
    target = target.with_options(model=model, greedy=lambda b: torch.full((len(b), 2), 3),
                                 teacher_forced=lambda b, e: model(b.source_ids, e))
    with pytest.raises(IndexError, match="index out of range"):  # what the model itself says
        model(torch.tensor([[5, 3, 6, 7, 4]]), torch.tensor([[1]]))
    with pytest.raises(TargetError) as error:
        run_validity_audit(target, progress=False)
    message = str(error.value)
    assert "batch 1: sources span 5 positions, more than the model's position limit of 4 " \
           "(pos_embed)" in message
    assert "'5 3 6 7 4'" in message and "Truncate or drop longer sources" in message


def test_a_device_this_machine_lacks_is_named_with_the_fix():
    from attnaudit.targets.placement import resolve_device

    if torch.cuda.is_available():
        bad, message = f"cuda:{torch.cuda.device_count()}", "CUDA device(s), cuda:0 to"
    else:
        bad, message = "cuda:1", "CUDA is not available here"
    with pytest.raises(TargetError, match=message):
        resolve_device(bad)


def test_command_line_warnings_are_one_line_each(tmp_path):
    pytest.importorskip("transformers")
    data = tmp_path / "long.tsv"
    data.write_text("3 March 2001\n" + "4 " * 40 + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, "-m", "attnaudit", "--quiet", "check", "--hf",
                             str(HF_MODEL), "--data", str(data)], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "attnaudit check: warning: 1 of 2 sources were longer than 64 tokens and were "
        "truncated to 64 (longest 81)"]
