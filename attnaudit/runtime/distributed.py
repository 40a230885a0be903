"""One audit across processes: ``torch.distributed`` (``torchrun``), sharded data, merged results.

A :class:`Shard` says which part of the data this process audits and how its results meet
the others'. Examples are dealt out in the target's own batches: batch ``b`` (global
examples ``b * batch_size`` onwards, numbered as in a single process) goes to rank
``b % world_size``. Each batch is therefore computed exactly as a single process computes
it (same padding, same per-(example, step) seeds), so per-row tables gathered and put back
in batch order equal the single-process tables bit for bit on the CPU, whatever the number
of ranks. Every rank reads every batch's texts and the ranks compare their digests
(:meth:`Shard.agree`): a target that shuffles or shards on its own is refused.

Results meet through collectives of the process group, never through files: analyser
states (sums, counts, minima, maxima, histograms) are all-reduced as float64 tensors
(:func:`attnaudit.analysis.merging.merge_analyser`, through :meth:`Shard.all_reduce`); the
small per-site facts, the per-batch performance rows and the intervention tables are
all-gathered as objects, so every rank holds the merged audit.

A failure on one rank is exchanged at the next meeting point (:meth:`Shard.together`):
every rank then raises :class:`RankError` (an attnaudit error on that rank) or
:class:`RankFailed` (anything else) naming the rank, so the job stops without a partial
report. A rank that dies outright is seen by its peers as a broken connection, and
``torchrun`` stops the others; a rank that hangs is given up after the collective
timeout, :data:`DEFAULT_TIMEOUT` (30 minutes; ``ATTNAUDIT_DIST_TIMEOUT`` in seconds
overrides it for a group attnaudit initialises). The timeout must exceed the longest time
one rank may wait for another at a meeting point, about one batch's work.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from attnaudit.analysis.merging import ReduceOp
from attnaudit.errors import AttnauditError, CollectiveError, RankError, RankFailed

DEFAULT_TIMEOUT = timedelta(minutes=30)
TIMEOUT_ENV = "ATTNAUDIT_DIST_TIMEOUT"
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class _Failure:
    rank: int
    kind: str
    message: str
    expected: bool  # an AttnauditError


@dataclass(frozen=True)
class Shard:
    """This process's part of an audit (the defaults: a single process, the whole data),
    and the collectives its results meet through
    (:class:`attnaudit.analysis.merging.Collectives`).

    Attributes:
        rank, world_size: this process's rank in the group and the group's size.
        local_rank: its index on its machine (``LOCAL_RANK``), which picks its GPU.
        backend: the group's backend (``gloo``, ``nccl``), None for a single process.
        group: the process group (None: the default group).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    group: Any = None

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        """Rank 0: the rank that prints progress and writes the report."""
        return self.rank == 0

    def owns(self, batch: int) -> bool:
        """Whether this rank audits the target's batch number ``batch`` (from 0)."""
        return batch % self.world_size == self.rank

    def device(self, requested: str | torch.device | None) -> str | torch.device | None:
        """The device this rank runs on: ``cuda:LOCAL_RANK`` for a plain ``"cuda"``, or
        for None under a backend with nccl; anything else as requested."""
        if self.backend is None:  # not distributed
            return requested
        if requested is None and "nccl" in self.backend:
            return f"cuda:{self.local_rank}"
        if requested is not None and str(requested) == "cuda":
            return f"cuda:{self.local_rank}"
        return requested

    def describe(self) -> dict[str, Any]:
        """What the manifest records: ``world_size`` and ``backend`` (None: one process)."""
        return {"world_size": self.world_size, "backend": self.backend}

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        with self._meeting():
            dist.all_gather_object(out, obj, group=self.group)
        return out

    @contextlib.contextmanager
    def _meeting(self) -> Iterator[None]:
        """A collective, whose failure (a peer that died, or did not come within the
        timeout) becomes a :class:`CollectiveError`."""
        try:
            yield
        except RuntimeError as exc:
            raise CollectiveError(
                f"rank {self.rank} of {self.world_size}: another rank did not take part in a "
                "collective (it died, or did not arrive within the collective timeout; "
                f"{TIMEOUT_ENV} sets it for the attnaudit command): "
                f"{' '.join(str(exc).split())}") from exc

    @contextlib.contextmanager
    def together(self, what: str) -> Iterator[None]:
        """Run a block on every rank, then exchange whether it failed anywhere.

        When any rank raised, every rank raises :class:`RankError` or :class:`RankFailed`
        naming the first failing rank, ``what`` it was doing and its error. A single process
        lets the error through unchanged.
        """
        if not self.is_distributed:
            yield
            return
        try:
            yield
        except Exception as exc:
            self._settle(what, _Failure(self.rank, type(exc).__name__,
                                        " ".join(str(exc).split()),
                                        isinstance(exc, AttnauditError)), exc)
            raise
        self._settle(what, None, None)

    def _settle(self, what: str, mine: _Failure | None, exc: Exception | None) -> None:
        failures = [f for f in self.all_gather(mine) if f is not None]
        if not failures:
            return
        first = failures[0]
        cls = RankError if first.expected else RankFailed
        raise cls(f"rank {first.rank} of {self.world_size} failed during {what}: "
                  f"{first.kind}: {first.message}") from exc

    def agree(self, what: str, value: Any) -> None:
        """Raise :class:`RankError` on every rank unless every rank holds the same
        ``value`` (picklable, comparable) of ``what``."""
        values = self.all_gather(value)
        for rank, theirs in enumerate(values):
            if theirs != values[0]:
                raise RankError(f"ranks 0 and {rank} of {self.world_size} see different "
                                f"{what}: every rank must read the same batches in the same "
                                "order (no shuffling or sharding of its own in the target)")

    def all_reduce(self, array: np.ndarray, op: ReduceOp) -> np.ndarray:
        """``array`` combined element-wise over every rank by ``op`` ("sum", "min",
        "max"), on every rank, as float64 of its shape (sent from this rank's GPU under
        nccl); a single process gets it back unchanged."""
        if not self.is_distributed:
            return array
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))
        if self.backend == "nccl":
            tensor = tensor.to(torch.device("cuda", self.local_rank))
        with self._meeting():
            dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()), group=self.group)
        return tensor.cpu().numpy().reshape(array.shape)


SINGLE = Shard()


class TextsDigest:
    """A digest of the texts of the batches a rank reads, in order, for the ranks to
    :meth:`Shard.agree` on."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, texts: Sequence[str]) -> None:
        self._hash.update(repr(list(texts)).encode())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def current_shard(group: Any = None) -> Shard:
    """The shard of this process in ``group``, or in the initialised default group; a
    single process (:data:`SINGLE`) when torch.distributed is not initialised."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    local = os.environ.get("LOCAL_RANK")
    rank = dist.get_rank(group)
    return Shard(rank=rank, world_size=dist.get_world_size(group),
                 local_rank=int(local) if local is not None else rank,
                 backend=str(dist.get_backend(group)), group=group)


def launched_by_torchrun() -> bool:
    """Whether the environment names this process's rank (``torchrun`` sets it)."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def collective_timeout() -> timedelta:
    """:data:`DEFAULT_TIMEOUT`, or ``ATTNAUDIT_DIST_TIMEOUT`` seconds when set."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 10**9:  # also refuses nan and inf
        raise AttnauditError(f"{TIMEOUT_ENV} must be a positive number of seconds, "
                             f"got {text!r}")
    return timedelta(seconds=seconds)


@contextlib.contextmanager
def torchrun_session() -> Iterator[Shard]:
    """Under ``torchrun``: initialise the default process group from the environment
    (nccl when each process of this machine has a GPU of its own, this process on
    ``cuda:LOCAL_RANK``; gloo otherwise; :func:`collective_timeout`), yield this process's
    shard, and destroy the group afterwards. Elsewhere, or when a group is already
    initialised, yield :func:`current_shard` and leave the group alone."""
    if not launched_by_torchrun() or not dist.is_available() or dist.is_initialized():
        yield current_shard()
        return
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus >= local_world else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    try:
        dist.init_process_group(backend=backend, timeout=collective_timeout())
    except RuntimeError as exc:
        raise CollectiveError(f"rank {os.environ['RANK']} cannot join the {backend} process "
                              f"group torchrun set up: {' '.join(str(exc).split())}") from exc
    try:
        yield current_shard()
        # Every rank has finished its last collective before any tears its connections
        # down: a rank leaving while a peer still reads from it aborts that peer in gloo.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def main_rank_output(shard: Shard) -> Iterator[None]:
    """Inside the block, what a rank other than 0 prints (progress, logs, results) is
    dropped; rank 0 prints as usual. Errors raised out of the block are printed after it."""
    if shard.is_main:
        yield
        return
    with (open(os.devnull, "w", encoding="utf-8") as sink, contextlib.redirect_stdout(sink),
          contextlib.redirect_stderr(sink)):
        yield
