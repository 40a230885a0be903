"""On a CUDA device in bfloat16: capture through the SDPA path equals the eager model's own
attention weights, and the quick audit runs. Skipped without CUDA (marker ``gpu``)."""

from __future__ import annotations

import pytest
import torch

import attnaudit
from tests.helpers.tiny_targets import SOURCES, _classes, save_tiny

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
transformers = pytest.importorskip("transformers")


def test_sdpa_capture_and_a_quick_audit_on_cuda_in_bfloat16(tmp_path):
    folder = save_tiny("llama", tmp_path / "llama", layers=2)
    _, model_cls = _classes("llama")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    sdpa = model_cls.from_pretrained(folder, attn_implementation="sdpa",
                                     dtype=torch.bfloat16).to("cuda").eval()
    eager = model_cls.from_pretrained(folder, attn_implementation="eager",
                                      dtype=torch.bfloat16).to("cuda").eval()
    ids = tokenizer(SOURCES[:1], return_tensors="pt").input_ids.to("cuda")
    with torch.no_grad(), attnaudit.capture(sdpa) as cap:
        sdpa(input_ids=ids)
    with torch.no_grad():
        truth = eager(input_ids=ids, output_attentions=True).attentions
    assert len(cap.sites) == len(truth)
    for site, expected in zip(cap.sites, truth, strict=True):
        got = cap.records[site].weights
        assert got.device.type == "cuda"
        torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=0)
    audit = attnaudit.audit(sdpa, SOURCES, tokenizer=tokenizer, quick=True, limit=2,
                            progress=False, max_new_tokens=3)
    assert audit.verdicts["validity"] == "pass"
