"""The ranks of a distributed run agreeing on its directory, at the recorder's start and nowhere
else.

Rank 0 creates the run (its lock, ``--force``, ``run.json``, ``rank0/``); then every other rank
joins it (its own ``rank{r}/``, its lock and ``rank.json``, which carries the run id read from
``run.json``). On several nodes the same holds whichever node starts first: only global rank 0
writes ``run.json``, and each rank only its own folder, so no two nodes write the same file. Between
the two, and after, the ranks agree that every one of them succeeded: an all-reduce of one integer,
over a gloo group (the default group when its backend has gloo, else one made for this and destroyed
after), so that a rank that cannot record stops all of them at the start with its own error, rather
than leaving the others to record a run with a missing rank. A resume first agrees on the step: the
last checkpoint that every rank holds and reads back.

These are the only collectives the recorder runs: none inside a training step, none at a
snapshot. A single process (``info`` is ``None``) runs none at all.

Where the guarantees stop: the agreement needs every rank to construct its Recorder (a rank that
never does leaves the others waiting at the start, for the process group's timeout); ranks on
several hosts must write to one shared file system.
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..capture import parallel
from ..capture.data import describe_loader
from ..capture.parallel import RankInfo
from ..errors import BisectReproError, RecordingError
from ..store.run import Run
from ..store.writer import Resumed, RunWriter
from ..trainee import Trainee

__all__ = ["AnotherRankFailed", "distributed_meta", "open_writer", "resume_writer"]

T = TypeVar("T")


class AnotherRankFailed(RecordingError):
    """This rank could go on, another could not: that rank's own error says why."""


class _Group:
    """The recorder's own channel between the ranks: integers, all-reduced with MIN."""

    def __init__(self) -> None:
        dist = torch.distributed
        self._own = None if "gloo" in str(dist.get_backend()) else dist.new_group(backend="gloo")

    def min(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN, group=self._own)
        return int(tensor.item())

    def all_ok(self, ok: bool) -> bool:
        return self.min(1 if ok else 0) == 1

    def close(self) -> None:
        if self._own is not None:
            torch.distributed.destroy_process_group(self._own)
            self._own = None


def _attempt(action: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    try:
        return action(), None
    except BisectReproError as error:
        return None, error


def _settle(group: _Group, error: BaseException | None, writer: Any, others: str) -> None:
    """Every rank learns whether all succeeded; if one did not, each raises (its own error, or
    ``others``)."""
    if group.all_ok(error is None):
        return
    if writer is not None:
        writer.close()
    raise error if error is not None else AnotherRankFailed(others)


def _reads_back(run: Run, step: int) -> bool:
    if step not in run.checkpoints:
        return False
    try:
        run.checkpoint(step)
        return True
    except BisectReproError as error:
        warnings.warn(f"{error}; resuming from an earlier checkpoint", stacklevel=4)
        return False


def distributed_meta(
    trainee: Trainee, info: RankInfo, environment: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``run.json``'s ``distributed`` (rank 0's is written) and this rank's ``rank.json``."""
    rank_meta = {
        **parallel.rank_identity(trainee.model, info),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loader": describe_loader(trainee.loader),
        "environment": environment,
    }
    described = parallel.describe(trainee.model, info)
    # rank 0's is kept; the others read it
    return described, {**rank_meta, "run_id": described["launcher"]["run_id"]}


def _of_this_run(out: Path | str, rank_meta: dict[str, Any]) -> dict[str, Any]:
    """``rank_meta`` with the run id rank 0 wrote into ``run.json`` (read, never written, by this
    rank)."""
    distributed = Run.open(out).distributed
    run_id = distributed.launcher.get("run_id") if distributed is not None else None
    return {**rank_meta, "run_id": run_id} if isinstance(run_id, str) else rank_meta


def open_writer(
    out: Path | str,
    meta: dict[str, Any],
    *,
    force: bool,
    info: RankInfo | None,
    rank_meta: dict[str, Any] | None,
) -> RunWriter:
    """The writer of this process's folder of a new run (see the module docstring)."""
    if info is None:
        return RunWriter.create(out, meta, force=force)
    assert rank_meta is not None
    group = _Group()
    try:
        writer, error = (
            _attempt(lambda: RunWriter.create(out, meta, force=force, rank_meta=rank_meta))
            if info.rank == 0
            else (None, None)
        )
        _settle(
            group, error, writer, f"{out}: rank 0 could not create the run; its own error says why"
        )
        if info.rank != 0:
            writer, error = _attempt(
                lambda: RunWriter.join(out, info.rank, _of_this_run(out, rank_meta))
            )
        _settle(
            group,
            error,
            writer,
            f"{out}: another rank could not start recording; its error says why",
        )
        assert writer is not None
        return writer
    finally:
        group.close()


def resume_writer(out: Path | str, info: RankInfo | None) -> tuple[RunWriter, Resumed]:
    """Reopen an interrupted run at its last checkpoint; on several ranks, the last that every rank
    reads back."""
    if info is None:
        return RunWriter.resume(out)
    group = _Group()
    try:
        run, error = _attempt(lambda: Run.open(out, info.rank))
        _settle(
            group, error, None, f"{out}: another rank cannot open its records; its error says why"
        )
        assert run is not None
        if run.world_size != info.world_size:
            raise RecordingError(
                f"{out}: was recorded on {run.world_size} ranks, not {info.world_size}; resume it "
                "on as many"
            )
        if group.all_ok(run.complete):
            raise RecordingError(
                f"{out}: the run is complete; nothing to resume (pass --force to record it again)"
            )
        bound: int | None = None
        while True:
            step = group.min(
                max((s for s in run.checkpoints if bound is None or s <= bound), default=-1)
            )
            if step < 0:
                raise RecordingError(
                    f"{out}: no checkpoint that every rank reads back; record it again with --force"
                )
            if group.all_ok(_reads_back(run, step)):
                break
            bound = step - 1
        resumed, error = _attempt(lambda: RunWriter.resume(out, info.rank, at=step))
        _settle(
            group,
            error,
            resumed[0] if resumed else None,
            f"{out}: another rank could not resume; its error says why",
        )
        assert resumed is not None
        return resumed
    finally:
        group.close()
