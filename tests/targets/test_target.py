"""The audit target contract: Batch, Seq2SeqTarget helpers, load_target and from_hf errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnaudit.errors import DataFileError, TargetError, TokenizerError
from attnaudit.targets.contract import Batch, Seq2SeqTarget
from attnaudit.targets.hf.loading import from_hf
from attnaudit.targets.loading import load_target

DATE_BART = Path(__file__).resolve().parents[2] / "examples" / "date_transformer" / "model"


def make_batch() -> Batch:
    ids = torch.tensor([[5, 6, 0], [7, 0, 0], [8, 9, 4]])
    return Batch(ids, ids != 0, ["a", "b", "c"], ["A", "B", "C"],
                 {"lengths": torch.tensor([2, 1, 3]), "tags": ["x", "y", "z"],
                  "shared": torch.ones(4), "scale": 0.5})


def test_batch_select_reorders_everything_that_follows_the_batch():
    batch = make_batch().select([2, 0])
    assert batch.source_ids.tolist() == [[8, 9, 4], [5, 6, 0]]
    assert batch.source_mask.tolist() == [[True, True, True], [True, True, False]]
    assert (batch.texts, batch.references) == (["c", "a"], ["C", "A"])
    assert batch.inputs["lengths"].tolist() == [3, 2]
    assert batch.inputs["tags"] == ["z", "x"]
    assert batch.inputs["shared"].shape == (4,) and batch.inputs["scale"] == 0.5
    assert len(make_batch().select(torch.tensor([], dtype=torch.long))) == 0


def test_batch_repeat_repeats_each_example_in_a_row():
    batch = make_batch().repeat(2)
    assert len(batch) == 6
    assert batch.texts == ["a", "a", "b", "b", "c", "c"]
    assert batch.inputs["lengths"].tolist() == [2, 2, 1, 1, 3, 3]
    assert batch.source_ids[3].tolist() == [7, 0, 0]


def tiny_target(**changes) -> Seq2SeqTarget:
    model = torch.nn.Linear(2, 2)
    base = Seq2SeqTarget(
        name="tiny", model=model, batches=lambda: [make_batch(), make_batch()],
        greedy=lambda b: torch.zeros(len(b), 2, dtype=torch.long),
        teacher_forced=lambda b, e: torch.zeros(*e.shape, 3), source_embedding=None,
        source_tokens=lambda b: [[]], target_tokens=lambda e: [[]], eos_id=2,
        special_ids=(0, 9))
    return base.with_options(**changes)


def test_step_mask_counts_steps_up_to_the_first_eos():
    emitted = torch.tensor([[4, 2, 5, 2], [2, 4, 4, 4], [4, 4, 4, 4], [4, 4, 4, 2]])
    expected = [[True, True, False, False], [True, False, False, False],
                [True, True, True, True], [True, True, True, True]]
    assert tiny_target().step_mask(emitted).tolist() == expected


def test_explain_keys_drop_padding_and_special_ids():
    keys = tiny_target().explain_keys(make_batch())
    assert keys.tolist() == [[True, True, False], [True, False, False], [True, False, True]]


def test_iter_batches_cuts_at_the_limit():
    target = tiny_target()
    assert [len(b) for b in target.iter_batches()] == [3, 3]
    assert [len(b) for b in target.iter_batches(4)] == [3, 1]
    assert [len(b) for b in target.iter_batches(3)] == [3]
    assert list(target.iter_batches(0)) == []
    with pytest.raises(ValueError, match="limit must be >= 0"):
        list(target.iter_batches(-1))


def test_with_options_copies():
    target = tiny_target()
    other = target.with_options(name="other", seed=3)
    assert (other.name, other.seed, target.name, target.seed) == ("other", 3, "tiny", 0)


@pytest.mark.parametrize(("spec", "message"), [
    ("no_colon", "TARGET must look like package.module:factory or file.py:factory"),
    ("attnaudit_examples.date.target:", "TARGET must look like"),
    ("missing_dir/target.py:make", "target file not found: missing_dir/target.py"),
    ("attnaudit_no_such_module:make", "cannot import target module 'attnaudit_no_such_module'"),
    ("attnaudit_examples.date.target:no_such_factory", "has no callable 'no_such_factory'"),
])
def test_load_target_spec_errors(spec, message):
    with pytest.raises(TargetError, match=message):
        load_target(spec)


@pytest.mark.parametrize(("body", "message"), [
    ("def make():\n    return 42\n", "returned int, not a Seq2SeqTarget"),
    ("def make():\n    raise KeyError('config')\n", "failed: KeyError: 'config'"),
    ("def make(:\n", "importing .* failed: SyntaxError"),
])
def test_load_target_file_errors(tmp_path, body, message):
    path = tmp_path / "target.py"
    path.write_text(body)
    with pytest.raises(TargetError, match=message):
        load_target(f"{path}:make")


def test_from_hf_errors(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(TargetError, match="model directory not found"):
        from_hf(tmp_path / "nothing", tmp_path / "data.tsv")
    with pytest.raises(DataFileError, match="data file not found"):
        from_hf(DATE_BART, tmp_path / "data.tsv")
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n  \n")
    with pytest.raises(DataFileError, match=r"empty\.tsv is empty"):
        from_hf(DATE_BART, empty)
    with pytest.raises(TargetError, match="the audit data is empty"):
        from_hf(DATE_BART, [])
    with pytest.raises(TokenizerError, match="has no tokenizer files"):
        from_hf(tmp_path, ["a source"])
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TargetError, match="cannot load a seq2seq model"):
        from_hf(tmp_path, ["a source"])


def test_date_target_teacher_forcing_its_greedy_output_reproduces_it():
    target = load_target(None)
    batch = next(target.iter_batches(16))
    emitted = target.greedy(batch)
    with torch.no_grad():
        logits = target.teacher_forced(batch, emitted)
    assert logits.shape[:2] == emitted.shape
    assert torch.equal(logits.argmax(-1), emitted)
    assert (emitted[:, -1] == target.eos_id).all()  # ten ISO characters, then EOS
    assert target.source_tokens(batch)[0][: len(batch.texts[0])] == list(batch.texts[0])
