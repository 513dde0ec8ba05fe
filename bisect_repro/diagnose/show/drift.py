"""Replica drift inside one distributed run, from its records: the tensors that data-parallel
replicas must hold equal, compared across ranks, snapshot by snapshot, after the fact (nothing is
communicated while training).

Which tensors, between which ranks, is what the run recorded (``run.json``'s ``distributed``):

- ``replicated: all`` (DDP): every parameter, optimizer-state tensor and buffer, but the buffers
  named in ``rank_local``, between the ranks of each rank's data-parallel group (``rank.json``'s
  ``replica_group``, the whole world by default);
- ``replicated: dtensor`` (FSDP2, DTensor parameters): a DTensor between the ranks whose mesh
  coordinates differ only along the dimensions where its placement is ``Replicate`` (none when it
  is sharded over every rank, as FSDP shards parameters and their optimizer state), as each
  snapshot records its placements; any other tensor but ``rank_local`` buffers over the whole
  world (Adam's ``step``);
- ``replicated: none`` (no parallel wrapper): nothing.

The trainee's own state (``state.<name>``) is never compared: it may be rank-local.

At each snapshot that every rank holds, in step order, every group's hashes are compared; the
first snapshot where one group disagrees is where the replicas part. The ranks named for a
tensor are those whose hash differs from most of its group's; with a tie, as between two
replicas, from the group's lowest rank.

Where the guarantees stop: equal hashes are equal bits (up to the hash's 64 bits); two replicas
that part cannot say which of them moved, so with two the rank named is the one that is not rank
0. Reading is every snapshot of every rank up to the first drift.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...errors import RunFormatError
from ...store.run import Run
from ..jsonform import plain_fields

__all__ = ["DriftedTensor", "RankDrift", "rank_drift"]


@dataclass(kw_only=True)
class DriftedTensor:
    tensor: str
    ranks: list[int]
    """The ranks whose copy differs from most of the group's (with a tie, from the lowest
    rank's)."""
    group: list[int]
    """The ranks that must hold it equal."""

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "ranks": self.ranks, "group": self.group}


@dataclass(kw_only=True)
class RankDrift:
    """Where the replicas of one run first part (``step`` is ``None`` when they never do)."""

    layout: str
    world_size: int
    replicated: str
    """``all``, ``dtensor`` or ``none``: what the run says its replicas share (see the module
    docstring)."""
    compared: int = 0
    """Tensors compared across ranks at the last snapshot read."""
    snapshots: list[int] = field(default_factory=list)
    """The snapshot steps compared."""
    last_equal: int | None = None
    step: int | None = None
    ranks: list[int] = field(default_factory=list)
    tensors: list[DriftedTensor] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **plain_fields(
                self,
                "layout",
                "world_size",
                "replicated",
                "compared",
                "snapshots",
                "last_equal",
                "step",
                "ranks",
            ),
            "tensors": [t.to_json() for t in self.tensors],
        }


def _mesh_groups(mesh: dict[str, Any], placements: list[str]) -> list[tuple[int, ...]]:
    """Ranks of the mesh that hold the same local shard: equal coordinates on every dimension not
    ``Replicate`` (``R``)."""
    shape, flat = mesh.get("shape") or [], _flatten(mesh.get("ranks"))
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, rank in enumerate(flat):
        coordinates, rest = [], index
        for size in reversed(shape):
            coordinates.append(rest % size)
            rest //= size
        coordinates.reverse()
        key = tuple(
            c for c, placement in zip(coordinates, placements, strict=False) if placement != "R"
        )
        groups.setdefault(key, []).append(rank)
    return [tuple(g) for g in groups.values() if len(g) > 1]


def _flatten(ranks: Any) -> list[int]:
    if isinstance(ranks, list):
        return [r for item in ranks for r in _flatten(item)]
    return [int(ranks)]


class _Groups:
    """Which ranks must hold each tensor equal, as the run recorded it."""

    def __init__(self, run: Run, ranks: list[Run]) -> None:
        self.replicated = run.distributed.replicated if run.distributed is not None else "none"
        self.rank_local = set(run.distributed.rank_local if run.distributed is not None else ())
        self.world = tuple(range(run.world_size))
        declared = {
            (r.rank_meta.replica_group if r.rank_meta is not None else None) or self.world
            for r in ranks
        }
        self.data_parallel = sorted(g for g in declared if len(g) > 1)

    def of(self, name: str, snapshot: dict[str, Any]) -> list[tuple[int, ...]]:
        if self.replicated == "none" or name.startswith("state.") or name in self.rank_local:
            return []
        if self.replicated == "all":
            return self.data_parallel
        placed = (snapshot.get("dtensors") or {}).get(name)
        if placed is None:
            return [self.world] if len(self.world) > 1 else []
        mesh = (snapshot.get("meshes") or {}).get(placed.get("mesh"))
        return (
            _mesh_groups(mesh, list(placed.get("placements") or []))
            if isinstance(mesh, dict)
            else []
        )


def _departing(values: dict[int, str | None]) -> list[int]:
    counts = Counter(values.values())
    most = max(counts.values())
    lowest = min(rank for rank, value in values.items() if counts[value] == most)
    return sorted(rank for rank, value in values.items() if value != values[lowest])


def rank_drift(run: Run) -> RankDrift:
    """Compare the replicas of ``run`` across its ranks, snapshot by snapshot (see the module
    docstring)."""
    replicated = run.distributed.replicated if run.distributed is not None else "none"
    drift = RankDrift(layout=run.layout, world_size=run.world_size, replicated=replicated)
    if run.world_size < 2 or drift.replicated == "none":
        return drift
    ranks = [run.open_rank(rank) for rank in range(run.world_size)]
    groups = _Groups(run, ranks)
    common = set.intersection(*(set(r.snapshots) for r in ranks))
    for step in sorted(common):
        snapshots = {r.rank: r.snapshot(step) for r in ranks}
        names = dict.fromkeys(
            name for snapshot in snapshots.values() for name in snapshot["hashes"]
        )
        drift.snapshots.append(step)
        drift.compared = 0
        for name in names:
            try:
                shared = groups.of(name, snapshots[0])
            except (TypeError, ValueError, AttributeError):
                where = ranks[0].folder / ranks[0].snapshots[step].file
                raise RunFormatError(
                    where,
                    f"the placements recorded for {name} are malformed",
                    "the file is damaged",
                ) from None
            drift.compared += bool(shared)
            for group in shared:
                values = {rank: snapshots[rank]["hashes"].get(name) for rank in group}
                if len(set(values.values())) > 1:
                    drift.tensors.append(
                        DriftedTensor(tensor=name, ranks=_departing(values), group=list(group))
                    )
        if drift.tensors:
            drift.step = step
            drift.ranks = sorted({rank for tensor in drift.tensors for rank in tensor.ranks})
            break
        drift.last_equal = step
    return drift
