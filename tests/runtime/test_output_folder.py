"""Output folders in-process: a failure while assembling changes nothing, and an interrupt
during the final swap waits for the swap to finish."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from attnaudit.errors import OutputFolderError
from attnaudit.runtime.output_folder import OutputFolder, _signals_deferred, is_attnaudit_output


def earlier_output(folder: Path) -> dict[str, bytes]:
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"libraries": {"attnaudit": "0.1"}}))
    (folder / "stale.csv").write_text("a\n1\n")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_failure_while_assembling_leaves_the_earlier_output_and_nothing_beside(tmp_path):
    target = tmp_path / "out"
    before = earlier_output(target)
    folder = OutputFolder.check(target)
    with pytest.raises(RuntimeError, match="half way"), folder.assembling() as staging:
        (staging / "index.html").write_text("partial")
        raise RuntimeError("half way")
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_new_folder_under_missing_parents_and_nothing_left_when_it_fails(tmp_path):
    target = tmp_path / "a" / "b" / "out"
    with pytest.raises(ValueError), OutputFolder.check(target).assembling():
        raise ValueError
    assert list(tmp_path.iterdir()) == []  # the parents it made are gone again
    with OutputFolder.check(target).assembling() as staging:
        (staging / "rows.csv").write_text("x\n")
    assert [p.name for p in target.iterdir()] == ["rows.csv"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_only_attnaudit_manifests_mark_an_output(tmp_path):
    assert not is_attnaudit_output(tmp_path)
    (tmp_path / "manifest.json").write_text('{"libraries": {"numpy": "2"}}')
    assert not is_attnaudit_output(tmp_path)
    (tmp_path / "manifest.json").write_text("not json")
    assert not is_attnaudit_output(tmp_path)
    with pytest.raises(OutputFolderError, match="not an attnaudit output"):
        OutputFolder.check(tmp_path)
    OutputFolder.check(tmp_path, force=True)


@pytest.fixture
def sigint_handler():
    """Sets SIGINT's handler for one test and restores the one the test run started with
    (which is SIG_IGN when pytest is launched in the background or by some CI wrappers)."""
    launched_with = signal.getsignal(signal.SIGINT)
    yield lambda handler: signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGINT, launched_with)


def test_interrupt_during_the_swap_is_acted_on_after_it(sigint_handler):
    sigint_handler(signal.default_int_handler)
    finished = []
    with pytest.raises(KeyboardInterrupt), _signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        finished.append("swap")  # still runs: the interrupt waits for the block
    assert finished == ["swap"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_interrupt_stays_ignored_across_the_swap(sigint_handler):
    sigint_handler(signal.SIG_IGN)
    finished = []
    with _signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        finished.append("swap")
    assert finished == ["swap"]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
