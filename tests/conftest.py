"""Shared fixtures: the committed date model and its fixed validation batch."""

from __future__ import annotations

import pytest
import torch

from examples.date.data import encode_sources, make_splits, vocabularies
from examples.date.model import DateAttentionModel, load_model


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():
    """The suite's models are small, and its machine is two cores shared with other jobs:
    there a second intra-op thread mostly waits (the suite ran several times slower with
    two threads than with one on a loaded machine). Results do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def date_splits():
    return make_splits()


@pytest.fixture(scope="session")
def date_vocabs(date_splits):
    return vocabularies(date_splits)


@pytest.fixture
def date_model() -> DateAttentionModel:
    return load_model()


@pytest.fixture(scope="session")
def date_batch(date_splits, date_vocabs):
    """The first 64 unambiguous validation sources: ids (64, n), lengths (64,), texts."""
    pairs = date_splits.unambiguous("valid", 64)
    src, lengths = encode_sources(date_vocabs[0], [s for s, _ in pairs])
    return src, lengths, [s for s, _ in pairs]


def model_fingerprint(model: torch.nn.Module) -> dict:
    """Everything capture promises to leave alone: parameters (bitwise), modes, flags, hooks."""
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "hooks": {n: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
                  for n, m in model.named_modules()},
    }


def assert_unchanged(model: torch.nn.Module, before: dict) -> None:
    after = model_fingerprint(model)
    assert after["requires_grad"] == before["requires_grad"]
    assert after["training"] == before["training"]
    assert after["hooks"] == before["hooks"]
    for name, value in before["params"].items():
        assert torch.equal(after["params"][name], value), name
