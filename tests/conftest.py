"""Shared fixtures: the committed date model and its fixed validation batch; each bundled
model's quick report, from the command line and from Python, once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnaudit_examples.date.data import encode_sources, make_splits, vocabularies
from attnaudit_examples.date.model import DateAttentionModel, load_model
from tests.helpers.fingerprints import model_fingerprint


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


ROOT = Path(__file__).resolve().parents[1]
DATE_LIMIT, BART_LIMIT = 12, 8
BUNDLED = {"date": (None, DATE_LIMIT),
           "date_transformer": ("attnaudit_examples.date_transformer.target:make_target",
                                BART_LIMIT)}


@pytest.fixture(scope="session")
def cli_reports(tmp_path_factory):
    """``attnaudit report NAME --limit N --quick`` for each bundled model, run once per
    session as CI would run it: a subprocess from the repository root (one intra-op
    thread, as in this process, so that float sums come out alike)."""
    written: dict[str, Path] = {}

    def report(name: str) -> Path:
        if name not in written:
            spec, limit = BUNDLED[name]
            out = tmp_path_factory.mktemp(f"cli_{name}")
            argv = [sys.executable, "-m", "attnaudit.cli", "report",
                    *([spec] if spec else []), "--limit", str(limit), "--quick",
                    "--out", str(out)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                    check=False, timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            written[name] = out
        return written[name]

    return report


@pytest.fixture(scope="session")
def api_audits():
    """``attnaudit.audit(target, limit=N, quick=True)`` for each bundled model, once per
    session, with the model's fingerprint from before the audit."""
    import attnaudit
    from attnaudit.targets.loading import load_target

    done: dict[str, tuple] = {}

    def run(name: str) -> tuple:
        if name not in done:
            spec, limit = BUNDLED[name]
            target = load_target(spec)
            before = model_fingerprint(target.model)
            done[name] = (attnaudit.audit(target, limit=limit, quick=True, progress=False),
                          target.model, before)
        return done[name]

    return run
