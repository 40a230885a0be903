"""Models placed by accelerate (``from_pretrained(..., device_map=..., offload_folder=...)``),
with layers offloaded to the CPU and to disk or the whole model on disk: the audit's tables
equal those of the same checkpoint loaded without a placement (timings apart), and such a
model is never moved, cast or copied."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import attnaudit
from attnaudit.errors import TargetError
from tests.helpers.tiny_targets import SOURCES, _classes, save_tiny

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

# Layers alternate between the CPU and disk; the embeddings stay on the CPU (where the
# inputs go), and for BART the embedding tied to the shared one stays beside it.
SPLIT = {
    "llama": {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
              "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": "disk",
              "model.rotary_emb": "cpu", "lm_head": "cpu"},
    "bart": {"model.shared": "cpu", "model.encoder.embed_tokens": "cpu",
             "model.encoder.embed_positions": "cpu", "model.encoder.layernorm_embedding": "cpu",
             "model.encoder.layers": "disk", "model.decoder.embed_tokens": "cpu",
             "model.decoder.embed_positions": "cpu", "model.decoder.layernorm_embedding": "cpu",
             "model.decoder.layers.0": "disk", "model.decoder.layers.1": "cpu",
             "lm_head": "cpu", "final_logits_bias": "cpu"},
}
PLACEMENTS = {"split": SPLIT, "disk": {"llama": {"": "disk"}, "bart": {"": "disk"}}}
TIMED = ("performance", "performance_totals")  # wall-clock tables differ run to run


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("placed")
    return {"llama": save_tiny("llama", root / "llama", layers=4),
            "bart": save_tiny("bart", root / "bart")}


def _load(name: str, folder: Path, device_map: dict[str, str] | None,
          offload: Path | None = None) -> Any:
    _, model_cls = _classes(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # accelerate's "parameters on the meta device"
        if device_map is None:
            return model_cls.from_pretrained(folder).eval()
        return model_cls.from_pretrained(folder, device_map=device_map,
                                         offload_folder=str(offload)).eval()


def _audit(model: Any, folder: Path, quick: bool) -> attnaudit.Audit:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return attnaudit.audit(model, SOURCES[:2], tokenizer=tokenizer, checks_only=not quick,
                           quick=quick, limit=2, progress=False, max_new_tokens=3)


def _assert_same_tables(placed: attnaudit.Audit, plain: attnaudit.Audit) -> None:
    assert sorted(placed.tables) == sorted(plain.tables)
    for name, expected in plain.tables.items():
        if name in TIMED:
            continue
        got = placed.tables[name]
        if name == "checklist":  # its performance item reads the timings
            got, expected = (t[t["item"] != "performance"] for t in (got, expected))
        assert list(got.columns) == list(expected.columns), name
        assert got.shape == expected.shape, name
        for column in expected.columns:
            a, b = got[column], expected[column]
            if pd.api.types.is_numeric_dtype(b) and not pd.api.types.is_bool_dtype(b):
                np.testing.assert_allclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-4,
                                           atol=1e-6, err_msg=f"{name}.{column}")
            else:
                assert a.astype(str).tolist() == b.astype(str).tolist(), f"{name}.{column}"
    assert placed.verdicts == plain.verdicts


@pytest.mark.parametrize("name", ["llama", "bart"])
@pytest.mark.parametrize("placement", ["split", "disk"])
def test_checks_on_a_placed_model_equal_the_unplaced_ones(name, placement, folders, tmp_path):
    placed = _load(name, folders[name], PLACEMENTS[placement][name], tmp_path)
    assert any(p.device.type == "meta" for p in placed.parameters())  # really offloaded
    plain = _audit(_load(name, folders[name], None), folders[name], quick=False)
    audit = _audit(placed, folders[name], quick=False)
    _assert_same_tables(audit, plain)
    assert audit.verdicts["validity"] == "pass"


@pytest.mark.parametrize(("name", "placement"), [("llama", "disk"), ("bart", "split")])
def test_the_quick_audit_of_a_placed_model_equals_the_unplaced_one(name, placement, folders,
                                                                    tmp_path):
    placed = _load(name, folders[name], PLACEMENTS[placement][name], tmp_path)
    plain = _audit(_load(name, folders[name], None), folders[name], quick=True)
    audit = _audit(placed, folders[name], quick=True)
    _assert_same_tables(audit, plain)
    assert audit.manifest["model"]["sha256"] == plain.manifest["model"]["sha256"]


def test_a_placed_model_goes_in_where_it_was_placed(folders, tmp_path):
    folder = folders["llama"]
    placed = _load("llama", folder, {"": "disk"}, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    target = attnaudit.from_hf(placed, SOURCES, tokenizer=tokenizer, device="cpu",
                               max_new_tokens=3)
    assert target.model is placed  # already there: not copied
    assert next(target.iter_batches()).source_ids.device.type == "cpu"  # not meta
    with pytest.raises(TargetError, match="placed by accelerate"):
        attnaudit.from_hf(placed, SOURCES, tokenizer=tokenizer, dtype="bfloat16",
                          max_new_tokens=3)
