"""What reading a run of many ranks costs: synthetic runs of N rank folders, read by ``show``'s
layout reader and by ``compare --no-replay``, timed, with the process's peak memory.

The runs are made from two real recordings of two ranks (``--a`` and ``--b``, recorded under
``torchrun --nnodes 2``, run B differing on rank 1): each synthetic rank r is a copy of rank
``r % 2``'s folder, its ``rank.json`` rewritten to rank r on node ``r // per_node``, and
``run.json`` to the world size. So every rank holds what a real rank of that recording holds, and
the runs differ on every odd rank.

Usage: ``python -m benchmarks.many_ranks --a RUN_A --b RUN_B --ranks 1000 --per-node 8 --work DIR``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from pathlib import Path
from typing import Any


def _synthetic(source: Path, out: Path, ranks: int, per_node: int) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    meta = json.loads((source / "run.json").read_text())
    meta["distributed"]["world_size"] = ranks
    meta["distributed"]["launcher"].update(nnodes=ranks // per_node, nproc_per_node=per_node)
    (out / "run.json").write_text(json.dumps(meta))
    for rank in range(ranks):
        folder = out / f"rank{rank}"
        shutil.copytree(source / f"rank{rank % 2}", folder, ignore=shutil.ignore_patterns(".lock"))
        found = json.loads((folder / "rank.json").read_text())
        found.update(
            rank=rank,
            world_size=ranks,
            node=rank // per_node,
            local_rank=rank % per_node,
            nnodes=ranks // per_node,
        )
        found.update(local_world_size=per_node, replica_group=None)
        (folder / "rank.json").write_text(json.dumps(found))


def _size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("--ranks", type=int, default=1000)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    from bisect_repro.diagnose.compare.compare import compare
    from bisect_repro.store.nodes import read_layout
    from bisect_repro.store.run import Run

    a, b = args.work / "a", args.work / "b"
    started = time.perf_counter()
    _synthetic(args.a, a, args.ranks, args.per_node)
    _synthetic(args.b, b, args.ranks, args.per_node)
    made = time.perf_counter() - started
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    found: dict[str, Any] = {
        "ranks": args.ranks,
        "per_node": args.per_node,
        "write_s": round(made, 1),
    }
    found["files"], found["bytes"] = _size(a)
    started = time.perf_counter()
    layout, _ = read_layout(Run.open(a))
    found["layout_s"] = round(time.perf_counter() - started, 2)
    found["nodes"] = len(layout.nodes)
    started = time.perf_counter()
    result = compare(a, b, replay=False)
    found["compare_s"] = round(time.perf_counter() - started, 1)
    found["verdict"] = (
        [result.verdict.step, result.verdict.rank, result.verdict.cause.value]
        if result.verdict
        else None
    )
    found["roles"] = {
        role: sum(1 for r in result.ranks if r.role == role) for role in ("origin", "receiver")
    }
    found["rss_after_import_mib"] = round(base / 1024)
    found["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
