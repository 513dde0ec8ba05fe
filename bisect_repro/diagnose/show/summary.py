"""What ``show`` says about one run directory: a :class:`RunSummary`, read by :func:`run_summary`.

The summary is typed until the edge: :meth:`RunSummary.to_json` is the ``bisect-repro/show/1``
object of ``show --json``, and the text and HTML reports read the summary itself. It is made here,
not in the store, because a distributed run's summary says where its replicas part
(:func:`~bisect_repro.diagnose.show.drift.rank_drift`).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from ...store.meta import CodeKind
from ...store.nodes import Layout, read_layout
from ...store.run import Run
from ...store.trust import provenance
from .drift import RankDrift, rank_drift

__all__ = ["SCHEMA", "RankStatus", "RunSummary", "run_summary"]

SCHEMA = "bisect-repro/show/1"


@dataclass(kw_only=True)
class RankStatus:
    """How far one rank of a distributed run got."""

    rank: int
    complete: bool
    last_step: int | None
    steps_logged: int
    host: str | None
    node: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class RunSummary:
    """What a run holds: steps, snapshots, checkpoints, config, environment, streams, losses.

    For a distributed run, ``complete`` and ``verified`` are over all ranks, and ``distributed``,
    ``ranks`` and ``replicas`` are set; the rest is rank 0's.
    """

    path: str
    format: int
    target: str | None
    config: dict[str, Any]
    options: dict[str, Any]
    """``run.json``'s ``options`` as recorded (``steps``, ``every``, ``checkpoint_every``, ...)."""
    recorded_by_you: bool
    """Signed with this user's key on this machine, every file as written: ``compare`` replays it
    without asking."""
    complete: bool
    steps_logged: int
    last_step: int | None
    snapshots: list[int]
    checkpoints: list[int]
    streams: list[str]
    """The random streams of the last snapshot (of ``run.json`` before the first)."""
    tensors_hashed: int
    verified: int | None
    """Snapshots and checkpoints read and checked in full (``None``: not asked for)."""
    first_loss: float | None
    last_loss: float | None
    snapshot_bytes: int
    checkpoint_bytes: int
    model: dict[str, int]
    """How many tensors of each kind (``parameters``, ``buffers``)."""
    loader: dict[str, Any]
    environment: dict[str, Any]
    distributed: dict[str, Any] | None = None
    """``run.json``'s ``distributed`` as recorded (``world_size``, ``layout``, ``backend``, ...);
    ``None`` for one process."""
    ranks: list[RankStatus] = field(default_factory=list)
    replicas: RankDrift | None = None
    edited: list[str] = field(default_factory=list)
    """Files of a run this user signed that no longer match their signed index lines."""
    layout: Layout | None = None
    """The nodes and ranks, with the ranks missing or incomplete (the run is then partial)."""
    command: str | None = None
    """A script's or module's run (no ``target``): the command, as typed (``python train.py --lr
    0.1``)."""
    cwd: str | None = None
    """The working directory the run was recorded in."""
    script: str | None = None
    """The file that ran (the script or the module's file), as recorded."""
    script_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "schema": SCHEMA,
            "path": self.path,
            "format": self.format,
            "target": self.target,
            "config": self.config,
            "options": self.options,
            "recorded_by_you": self.recorded_by_you,
            "edited": self.edited,
            "complete": self.complete,
            "steps_logged": self.steps_logged,
            "last_step": self.last_step,
            "snapshots": self.snapshots,
            "checkpoints": self.checkpoints,
            "streams": self.streams,
            "tensors_hashed": self.tensors_hashed,
            "verified": self.verified,
            "first_loss": self.first_loss,
            "last_loss": self.last_loss,
            "bytes": {"snapshots": self.snapshot_bytes, "checkpoints": self.checkpoint_bytes},
            "model": self.model,
            "loader": self.loader,
            "environment": self.environment,
            "command": self.command,
            "cwd": self.cwd,
            "script": self.script,
            "script_sha256": self.script_sha256,
        }
        if self.distributed is not None:
            found["distributed"] = self.distributed
            found["ranks"] = [rank.to_json() for rank in self.ranks]
            found["replicas"] = self.replicas.to_json() if self.replicas is not None else None
            found["layout"] = self.layout.to_json() if self.layout is not None else None
        return found


def run_summary(run: Run, *, verify: bool = False) -> RunSummary:
    """What a run holds (``bisect-repro show``).

    ``verify`` reads every committed snapshot and checkpoint (checksums, sizes, contents), not
    only the last snapshot, of every rank. A distributed run adds each rank's completeness and
    where its replicas first part (:func:`rank_drift`), and its nodes (:func:`read_layout`): a
    partial run (a rank missing) says which, and its replicas are not compared.
    """
    layout, ranks = read_layout(run) if run.distributed else (None, [run])
    summary = _rank_summary(run, verify=verify)
    found = provenance(run)
    summary.recorded_by_you, summary.edited = found.yours, list(found.edited)
    for other in ranks[1:] if verify else []:
        _rank_summary(other, verify=True)
    if run.distributed:
        summary.distributed = run.meta.raw["distributed"]
        summary.ranks = [
            RankStatus(
                rank=r.rank,
                complete=r.complete,
                last_step=r.last_step,
                steps_logged=len(r.steps),
                host=r.rank_meta.hostname if r.rank_meta is not None else None,
                node=layout.node_of(r.rank) if layout is not None else None,
            )
            for r in ranks
        ]
        summary.layout = layout
        summary.replicas = rank_drift(run) if layout is None or not layout.missing else None
        summary.complete = all(r.complete for r in ranks) and not (
            layout is not None and layout.partial
        )
        summary.verified = (
            sum(len(r.snapshots) + len(r.checkpoints) for r in ranks) if verify else None
        )
    return summary


def _launch(run: Run) -> dict[str, Any]:
    """The command, working directory and file of a run recorded from a script or module (``{}`` for
    a recipe)."""
    launch = run.meta.launch
    code = launch.code if launch is not None else None
    if launch is None or code is None or code.kind is CodeKind.RECIPE or run.meta.target:
        return {}
    words = ["python", *(("-m",) if code.kind is CodeKind.MODULE else ()), *launch.argv]
    return {
        "command": shlex.join(words),
        "cwd": launch.cwd,
        "script": code.path,
        "script_sha256": code.sha256,
    }


def _rank_summary(run: Run, *, verify: bool) -> RunSummary:
    losses = [loss for loss in run.losses().values() if loss is not None]
    meta = run.meta
    last_snapshot = run.snapshot(max(run.snapshots)) if run.snapshots else None
    if verify:
        for step in run.snapshots:
            run.snapshot(step)
        for step in run.checkpoints:
            run.checkpoint(step)
    return RunSummary(
        path=str(run.path),
        format=meta.format,
        target=meta.target,
        config=meta.config,
        options=meta.raw.get("options") or {},
        recorded_by_you=False,
        complete=run.complete,
        steps_logged=len(run.steps),
        last_step=run.last_step,
        snapshots=sorted(run.snapshots),
        checkpoints=sorted(run.checkpoints),
        streams=sorted(last_snapshot["streams"]) if last_snapshot else list(meta.streams),
        tensors_hashed=len(last_snapshot["hashes"]) if last_snapshot else 0,
        verified=len(run.snapshots) + len(run.checkpoints) if verify else None,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
        snapshot_bytes=sum(e.bytes for e in run.snapshots.values()),
        checkpoint_bytes=sum(e.bytes for e in run.checkpoints.values()),
        model={kind: len(names) for kind, names in meta.model.items()},
        loader=meta.loader,
        environment=meta.environment,
        **_launch(run),
    )
