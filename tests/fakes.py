"""Runs written directly through the store, without training: each rank's step lines and snapshot
hashes as the test says, for the readers and the comparisons that read them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_repro.store.run import Run
from bisect_repro.store.writer import RunWriter

MODEL = {"parameters": {"w": [[2], "float32"]}, "buffers": {"bn.running_mean": [[2], "float32"]}}


def distributed_meta(
    world: int, *, layout: str = "ddp", replicated: str = "all", **extra: Any
) -> dict[str, Any]:
    described = {
        "world_size": world,
        "backend": "gloo",
        "layout": layout,
        "mesh": None,
        "replicated": replicated,
        "rank_local": [],
    }
    return {
        "target": None,
        "config": {},
        "model": MODEL,
        "environment": {},
        "distributed": {**described, **extra},
    }


def fake_ranks(
    path: Path,
    hashes: Mapping[int, Mapping[int, Mapping[str, str]]],
    *,
    losses: Mapping[int, list[float]] | None = None,
    seeded: Mapping[int, Mapping[int, str]] | None = None,
    snapshot_extra: Mapping[str, Any] | None = None,
    rank_extra: Mapping[int, Mapping[str, Any]] | None = None,
    **distributed: Any,
) -> Path:
    """A finished run of ``len(hashes)`` ranks: ``hashes[rank][step]`` the snapshot hashes,
    ``losses[rank]`` the step losses (one step per loss, 1.0 by default), ``seeded[rank][step]`` an
    entropy seeding call."""
    world = len(hashes)
    meta = distributed_meta(world, **distributed)
    writers = []
    for rank in range(world):
        rank_meta = {
            "rank": rank,
            "world_size": world,
            "environment": {},
            **(rank_extra or {}).get(rank, {}),
        }
        writers.append(
            RunWriter.create(path, meta, rank_meta=rank_meta)
            if rank == 0
            else RunWriter.join(path, rank, rank_meta)
        )
    for rank, writer in enumerate(writers):
        steps = (losses or {}).get(rank) or [1.0] * max(hashes[rank])
        for step, loss in enumerate(steps):
            line: dict[str, Any] = {"step": step, "loss": loss, "order": "o", "batch": "b"}
            if step in (seeded or {}).get(rank, {}):
                line["seeded"] = [
                    {
                        "stream": "torch",
                        "call": "torch.seed()",
                        "entropy": True,
                        "where": seeded[rank][step],  # type: ignore[index]
                    }
                ]
            writer.append_steps([line])
        for step, values in hashes[rank].items():
            writer.commit(
                "snapshot",
                step,
                {
                    "step": step,
                    "hashes": dict(values),
                    "streams": {},
                    "data": {},
                    **(snapshot_extra or {}),
                },
            )
        writer.finish(max(hashes[rank]))
        writer.close()
    return path


def write_run(
    path: Path,
    lines: list[dict[str, Any]],
    snapshots: Mapping[int, Mapping[str, Any]],
    checkpoints: Mapping[int, Mapping[str, Any]] | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    environment: Mapping[str, Any] | None = None,
    **meta: Any,
) -> Run:
    """A finished single-process run: its step lines as given, ``snapshots[step]`` the snapshot
    trees (``hashes``, ``streams``, ``data``) and ``checkpoints[step]`` the checkpoint trees."""
    model = {"parameters": {"fc.weight": [[2], "float32"]}, "buffers": {}}
    writer = RunWriter.create(
        path,
        {
            "target": None,
            "config": dict(config or {}),
            "model": model,
            "environment": dict(environment or {}),
            **meta,
        },
    )
    writer.append_steps(lines)
    for step, tree in sorted(snapshots.items()):
        writer.commit(
            "snapshot", step, {"step": step, "hashes": {}, "streams": {}, "data": {}, **tree}
        )
    for step, tree in sorted((checkpoints or {}).items()):
        writer.commit("checkpoint", step, dict(tree))
    writer.finish(max(snapshots))
    writer.close()
    return Run.open(path)
