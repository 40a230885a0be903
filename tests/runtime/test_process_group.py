"""``attnaudit.audit`` in a process group it is given (here a gloo group of one process, in
this process): every merge runs through the collectives and the audit is the plain one."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

import attnaudit
from attnaudit.auditing.intervention_suite import run_suite
from attnaudit.errors import AttnauditError, RankError, RankFailed
from attnaudit.runtime.distributed import (
    DEFAULT_TIMEOUT,
    SINGLE,
    TIMEOUT_ENV,
    Shard,
    collective_timeout,
    current_shard,
)
from attnaudit.targets.loading import load_target
from attnaudit.validity.pipeline import run_validity_audit
from tests.helpers.timing import assert_same_untimed_tables


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_audit_through_the_collectives_equals_the_plain_audit(group_of_one):
    target = load_target("tests.helpers.distributed_targets:date_lstm")
    merged = attnaudit.audit(target, limit=8, quick=True, progress=False,
                             process_group=group_of_one)
    assert merged.manifest["distributed"] == {"world_size": 1, "backend": "gloo"}
    dist.destroy_process_group()  # the plain audit: no group anywhere
    try:
        assert not current_shard().is_distributed
        plain = attnaudit.audit(target, limit=8, quick=True, progress=False)
    finally:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert_same_untimed_tables(merged.tables, plain.tables)
    assert merged.validity.example is not None  # rank 0 audited batch 0
    # the explorer's examples came through the collectives: the same examples, the same maps
    assert [e.index for e in merged.validity.kept_examples] == [
        e.index for e in plain.validity.kept_examples] == [0, 1, 2, 3, 4]
    for mine, theirs in zip(merged.validity.kept_examples, plain.validity.kept_examples,
                            strict=True):
        assert mine.source == theirs.source and list(mine.maps) == list(theirs.maps)
    assert merged.gate().status == plain.gate().status == 0


def test_a_failure_inside_together_is_raised_naming_the_rank(group_of_one):
    shard = current_shard()
    assert (shard.rank, shard.world_size, shard.is_main) == (0, 1, True)
    unexpected = pytest.raises(RankFailed, match=r"rank 0 of 1 failed during the test: "
                                                 r"ZeroDivisionError: division by zero")
    with unexpected, shard.together("the test"):
        _ = 1 / 0
    expected = pytest.raises(RankError, match="rank 0 of 1 failed during the test: "
                                              "AttnauditError: a clear message")
    with expected, shard.together("the test"):
        raise AttnauditError("a clear message")
    with shard.together("the test"):
        pass


def test_batches_are_dealt_round_robin_and_cuda_means_this_ranks_gpu():
    second = Shard(rank=1, world_size=2, local_rank=1, backend="nccl")
    assert [b for b in range(7) if second.owns(b)] == [1, 3, 5]
    assert all(SINGLE.owns(b) for b in range(7))
    assert (second.device(None), second.device("cuda"), second.device("cuda:0"),
            second.device("cpu")) == ("cuda:1", "cuda:1", "cuda:0", "cpu")
    on_cpu = Shard(rank=1, world_size=2, local_rank=1, backend="gloo")
    assert (on_cpu.device(None), on_cpu.device("cuda")) == (None, "cuda:1")
    assert SINGLE.device("cuda") == "cuda" and SINGLE.describe() == {"world_size": 1,
                                                                     "backend": None}


class OtherDataOnRank1(Shard):
    """Rank 0 of two whose peer (simulated) iterates other data; the other meeting points
    hear nothing wrong."""

    def all_gather(self, obj):
        return [obj, "another digest" if isinstance(obj, str) else obj]


@pytest.mark.parametrize("run", [run_validity_audit, run_suite])
def test_ranks_that_read_other_data_are_refused(run):
    target = load_target("tests.helpers.distributed_targets:date_lstm")
    shard = OtherDataOnRank1(rank=0, world_size=2, backend="gloo")
    with pytest.raises(RankError, match="ranks 0 and 1 of 2 see different data: every rank "
                                        "must read the same batches"):
        run(target, limit=8, progress=False, shard=shard)


def test_the_collective_timeout_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert collective_timeout() == DEFAULT_TIMEOUT == timedelta(minutes=30)
    monkeypatch.setenv(TIMEOUT_ENV, "90")
    assert collective_timeout() == timedelta(seconds=90)
    for bad in ("0", "-5", "soon", "nan", "inf"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(AttnauditError, match="must be a positive number of seconds"):
            collective_timeout()
