"""A module fixture for tests of tiny models: one intra-op thread (on a busy machine more
threads only add synchronisation cost). Import it into a test module to use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
