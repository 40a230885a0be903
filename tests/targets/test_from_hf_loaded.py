"""``from_hf`` with a model and tokenizer already loaded: the same audit as from the folder,
the user's model left exactly as it was, audit data from lists, pandas and TSV files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

import attnaudit
from attnaudit.errors import TargetError
from attnaudit.targets.hf.loading import from_hf
from tests.helpers.fingerprints import assert_unchanged, model_fingerprint
from tests.helpers.timing import assert_same_untimed_tables

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
DATE_BART = ROOT / "examples" / "date_transformer" / "model"
AUDIT_TSV = ROOT / "examples" / "date_transformer" / "audit.tsv"
LIMIT = 4


def _load():
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(DATE_BART)
    return model, transformers.AutoTokenizer.from_pretrained(DATE_BART)


def _state(model: torch.nn.Module) -> dict:
    """What from_hf promises to leave alone, beyond the fingerprint: placement, dtype and
    the attention backend."""
    return {"devices": {p.device for p in model.parameters()},
            "dtypes": {p.dtype for p in model.parameters()},
            "backend": model.config._attn_implementation,
            "fingerprint": model_fingerprint(model)}


def _assert_same_state(model: torch.nn.Module, before: dict) -> None:
    now = _state(model)
    assert {k: now[k] for k in ("devices", "dtypes", "backend")} == \
        {k: before[k] for k in ("devices", "dtypes", "backend")}
    assert_unchanged(model, before["fingerprint"])


def test_a_loaded_model_audits_as_its_folder_does():
    model, tokenizer = _load()
    before = _state(model)
    loaded = attnaudit.audit(model, tokenizer=tokenizer, data=AUDIT_TSV, limit=LIMIT,
                             quick=True, progress=False)
    folder = attnaudit.audit(DATE_BART, data=AUDIT_TSV, limit=LIMIT, quick=True,
                             progress=False)
    _assert_same_state(model, before)
    assert list(loaded.tables) == list(folder.tables)
    assert_same_untimed_tables(loaded.tables, folder.tables)
    assert loaded.manifest["model"]["sha256"] == folder.manifest["model"]["sha256"]
    assert loaded.manifest["data"] == folder.manifest["data"]


def test_data_from_lists_pandas_and_tsv_give_the_same_batches():
    model, tokenizer = _load()
    pairs = [line.split("\t") for line in AUDIT_TSV.read_text().splitlines()[:5]]
    sources = [s for s, _ in pairs]
    frame = pd.DataFrame(pairs, columns=["source", "iso"])
    tsv = from_hf(model, AUDIT_TSV, tokenizer=tokenizer, batch_size=5)
    expected = next(tsv.iter_batches(5))
    for data in (sources, frame["source"], frame, frame[["source"]]):
        batch = next(from_hf(model, data, tokenizer=tokenizer).iter_batches())
        assert batch.texts == sources
        assert torch.equal(batch.source_ids, expected.source_ids)
    assert next(from_hf(model, frame, tokenizer=tokenizer).iter_batches()).references == \
        [t for _, t in pairs] == expected.references


def test_a_datasets_column_is_audit_data():
    datasets = pytest.importorskip("datasets")
    model, tokenizer = _load()
    column = datasets.Dataset.from_dict({"text": ["3 march 2001", "april 4, 1999"]})["text"]
    assert next(from_hf(model, column, tokenizer=tokenizer).iter_batches()).texts == [
        "3 march 2001", "april 4, 1999"]


def test_device_and_dtype_place_a_copy():
    model, tokenizer = _load()
    before = _state(model)
    target = from_hf(model, ["3 march 2001"], tokenizer=tokenizer, dtype="bfloat16")
    assert target.model is not model
    assert {p.dtype for p in target.model.parameters()} == {torch.bfloat16}
    _assert_same_state(model, before)
    same = from_hf(model, ["3 march 2001"], tokenizer=tokenizer, dtype="float32",
                   device="cpu")
    assert same.model is model  # nothing to change: the model itself


def test_a_model_in_training_mode_is_left_so_with_a_warning():
    model, tokenizer = _load()
    model.train()
    before = _state(model)
    with pytest.warns(UserWarning, match="training mode"):
        target = from_hf(model, ["3 march 2001"], tokenizer=tokenizer)
    assert target.model is model
    _assert_same_state(model, before)


def test_a_contrast_output_that_is_not_a_string_is_a_clear_error():
    model, tokenizer = _load()
    with pytest.raises(TargetError, match="contrast outputs must be strings, got int 7 in "
                                          "contrast="):
        from_hf(model, ["3 march 2001"], tokenizer=tokenizer, contrast=[7])


@pytest.mark.parametrize(("data", "tokenizer", "message"), [
    (["3 march 2001"], None, "a loaded model needs its tokenizer"),
    ([3, 4], "tok", "audit sources must be strings, got int"),
    (["3 march 2001", None], "tok", "audit sources must be strings, got NoneType"),
    (pd.DataFrame({"a": ["x"], "b": ["y"], "c": ["z"], "d": ["w"]}), "tok", "1 to 3 columns"),
    (pd.DataFrame({"a": ["x"], "b": ["y"], "c": [None]}), "tok",
     "contrast outputs must be strings, got NoneType None in column 'c' of the DataFrame"),
])
def test_bad_loaded_inputs_are_clear_errors(data, tokenizer, message):
    model, real_tokenizer = _load()
    with pytest.raises(TargetError, match=message):
        from_hf(model, data, tokenizer=real_tokenizer if tokenizer else None)


def test_a_module_that_is_not_a_seq2seq_model_is_refused():
    _, tokenizer = _load()
    with pytest.raises(TargetError, match="needs a Hugging Face seq2seq model"):
        from_hf(torch.nn.Linear(2, 2), ["x"], tokenizer=tokenizer)
