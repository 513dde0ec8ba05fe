"""A distributed run's nodes and ranks, read from every rank's folder and checked against
``run.json``.

Each rank of a run recorded under torchrun wrote its own ``rank{r}/rank.json``, keyed by its
global rank: the run id it read from ``run.json``, its node (torchrun's ``GROUP_RANK``), its local
rank, its host and the nodes' shape it was launched with. :func:`read_layout` opens every rank
the run's world size implies and returns the :class:`Layout`: the nodes with their hosts and
ranks, and the ranks that are missing (no folder) or incomplete (no ``end`` line: a node that
died). A run with either is partial.

Refused, one line naming the rank (:class:`~bisect_repro.errors.RunFormatError`), per
:data:`_CHECKS`: a rank folder of another run (its run id is not ``run.json``'s), a rank that
says it is of another world size or another nodes' shape (a node launched with other options),
and two ranks that claim the same place (node and local rank): a duplicate global rank.

Where the guarantees stop: a run recorded before run ids were recorded (or outside torchrun) has
no run id or node to check, and is read as it is; hosts are as each rank named itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RunFormatError
from .run import Run, rank_folder

__all__ = ["Layout", "NodeRanks", "read_layout"]

_REDO = "record the run again with the same torchrun options on every node"


@dataclass(frozen=True)
class NodeRanks:
    """One node of the run: its number (``None`` when not launched by torchrun), its hosts, its
    global ranks."""

    node: int | None
    hosts: tuple[str, ...]
    ranks: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "hosts": list(self.hosts), "ranks": list(self.ranks)}


@dataclass
class Layout:
    """The nodes and ranks a run's folders hold (see the module docstring)."""

    world_size: int
    nnodes: int | None
    nproc_per_node: int | None
    nodes: list[NodeRanks] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    """Ranks with no folder (or no ``rank.json``)."""
    incomplete: dict[int, int | None] = field(default_factory=dict)
    """Ranks whose records stop before the end: rank to its last committed step."""

    @property
    def partial(self) -> bool:
        return bool(self.missing or self.incomplete)

    def node_of(self, rank: int) -> int | None:
        return next((n.node for n in self.nodes if rank in n.ranks), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "nproc_per_node": self.nproc_per_node,
            "nodes": [n.to_json() for n in self.nodes],
            "missing": self.missing,
            "incomplete": {str(r): s for r, s in self.incomplete.items()},
            "partial": self.partial,
        }


def _run_id(run: Run, rank: Run) -> str | None:
    raw = rank.rank_meta.raw if rank.rank_meta is not None else {}
    ours = run.distributed.launcher.get("run_id") if run.distributed is not None else None
    theirs = raw.get("run_id")
    if isinstance(ours, str) and isinstance(theirs, str) and ours != theirs:
        return f"is from another run (its run id {theirs[:12]}, this run's {ours[:12]})"
    return None


def _world(run: Run, rank: Run) -> str | None:
    said = rank.rank_meta.world_size if rank.rank_meta is not None else None
    return (
        f"says a world size of {said}, run.json {run.world_size}"
        if said is not None and said != run.world_size
        else None
    )


def _shape(run: Run, rank: Run) -> str | None:
    raw = rank.rank_meta.raw if rank.rank_meta is not None else {}
    launcher = run.distributed.launcher if run.distributed is not None else {}
    said, ours = (
        (raw.get("nnodes"), raw.get("local_world_size")),
        (launcher.get("nnodes"), launcher.get("nproc_per_node")),
    )
    if None in said or None in ours or said == ours:
        return None
    return f"was launched as {said[0]} nodes x {said[1]} ranks, the run as {ours[0]} x {ours[1]}"


_CHECKS: tuple[Callable[[Run, Run], str | None], ...] = (_run_id, _world, _shape)
"""Each rank against ``run.json``: a problem, or ``None``."""


def _place(rank: Run) -> tuple[int | None, int | None, str | None]:
    raw = rank.rank_meta.raw if rank.rank_meta is not None else {}
    node, local = raw.get("node"), raw.get("local_rank")
    host = rank.rank_meta.hostname if rank.rank_meta is not None else None
    return (node if type(node) is int else None), (local if type(local) is int else None), host


def _open(run: Run, rank: int) -> Run | None:
    """The rank, or ``None`` when its folder or ``rank.json`` is missing (any other damage is an
    error)."""
    try:
        return run.open_rank(rank)
    except RunFormatError as error:
        if error.path.name in (rank_folder(rank), "rank.json") and (
            "has no records" in error.problem or error.problem == "missing"
        ):
            return None
        raise


def read_layout(run: Run) -> tuple[Layout, list[Run]]:
    """The run's :class:`Layout` and the ranks that could be opened, in rank order."""
    launcher = run.distributed.launcher if run.distributed is not None else {}
    nnodes, nproc = launcher.get("nnodes"), launcher.get("nproc_per_node")
    layout = Layout(
        run.world_size,
        nnodes if type(nnodes) is int else None,
        nproc if type(nproc) is int else None,
    )
    opened: list[Run] = []
    places: dict[tuple[int, int], int] = {}
    hosts: dict[int | None, tuple[list[str], list[int]]] = {}
    for number in range(run.world_size):
        rank = _open(run, number) if run.distributed is not None else run
        if rank is None:
            layout.missing.append(number)
            continue
        where = run.path / rank_folder(number) / "rank.json"
        for check in _CHECKS:
            problem = check(run, rank)
            if problem is not None:
                raise RunFormatError(where, f"rank {number} {problem}", _REDO)
        node, local, host = _place(rank)
        if node is not None and local is not None:
            other = places.setdefault((node, local), number)
            if other != number:
                raise RunFormatError(
                    where,
                    f"rank {number} duplicates rank {other}: both say node {node}, local rank "
                    f"{local}",
                    _REDO,
                )
        names, ranks = hosts.setdefault(node, ([], []))
        if host is not None and host not in names:
            names.append(host)
        ranks.append(number)
        if not rank.complete:
            layout.incomplete[number] = rank.last_step
        opened.append(rank)
    layout.nodes = [
        NodeRanks(n, tuple(h), tuple(r))
        for n, (h, r) in sorted(hosts.items(), key=lambda item: (item[0] is None, item[0] or 0))
    ]
    return layout, opened
