"""The cost of a snapshot per rank, at 1 and 2 ranks: what each rank pays on its training thread.

    python -m benchmarks.distributed --out benchmarks/results      # about a minute on 2 cores
    python -m benchmarks.distributed --out /tmp/bench --quick      # seconds (the smoke test)

Each world size is launched through ``torch.distributed.run --standalone`` with
``OMP_NUM_THREADS=1`` for both (torchrun sets it only for more than one rank): every rank trains
a DDP MLP (gloo) under a Recorder that snapshots every step, and times each ``_snapshot`` call on
its training thread (hashing every parameter and Adam tensor, fetching the hashes, taking host
copies of the streams and data position, handing them to the writer thread), in wall time and in
the CPU time of that thread (what the snapshot costs in work, whoever else shares the cores). A
snapshot reads and writes only the rank's own tensors and folder and communicates nothing, so its
cost should not depend on the world size; on this machine two ranks also share two cores with their
two writer threads, which is what the 2-rank figure includes, and the training step (forward,
backward with its all-reduce, Adam; no snapshot) is timed alongside for scale. Writes
``distributed.json`` and ``distributed.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee

WIDTH, DEPTH = 512, 4  # about 0.8M parameters, 9.5 MB with Adam's state


class TimedRecorder(Recorder):
    """A Recorder that times each snapshot on the training thread."""

    times: list[float]
    cpu: list[float]

    def _snapshot(self, step: int) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        super()._snapshot(step)
        self.times.append(time.perf_counter() - started)
        self.cpu.append(time.thread_time() - cpu)


def worker(out: Path, steps: int) -> None:
    """One rank: train a DDP MLP for ``steps`` steps with a snapshot at each, and write the
    timings."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(WIDTH, 1)))
    data = TensorDataset(torch.randn(4096, WIDTH), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, seed=0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    options = RecordOptions(steps=steps, every=1, checkpoint_every=None, force=True)
    recorder = TimedRecorder(out / "run", Trainee(model, optimizer, loader), options)
    recorder.times, recorder.cpu = [], []
    trained = []
    with recorder:
        for inputs, targets in recorder.batches():
            started = time.perf_counter()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            recorder.log(loss)
            trained.append(time.perf_counter() - started)
    timed = recorder.times[2:]  # the first snapshots warm the hash's buffers up
    snapshot = Path(out / "run" / f"rank{rank}" / "snapshots").glob("*.st.zst")
    sizes = [p.stat().st_size for p in snapshot]
    result = {
        "rank": rank,
        "snapshots": len(timed),
        "ms": [round(t * 1e3, 3) for t in timed],
        "cpu ms": [round(t * 1e3, 3) for t in recorder.cpu[2:]],
        "step ms": [round(t * 1e3, 3) for t in trained[2:]],
        "bytes": statistics.median(sizes),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def measure(world: int, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
        ]
        command += ["-m", "benchmarks.distributed", "--worker", folder, "--steps", str(steps)]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=900,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        ranks = [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(world)]
    every = [t for rank in ranks for t in rank["ms"]]
    quartiles = statistics.quantiles(every, n=4)
    step = statistics.median(t for rank in ranks for t in rank["step ms"])
    return {
        "ranks": world,
        "snapshots timed per rank": ranks[0]["snapshots"],
        "median ms": round(statistics.median(every), 2),
        "p25 ms": round(quartiles[0], 2),
        "p75 ms": round(quartiles[2], 2),
        "per rank median ms": [round(statistics.median(rank["ms"]), 2) for rank in ranks],
        "cpu median ms": round(statistics.median(t for rank in ranks for t in rank["cpu ms"]), 2),
        "step ms": round(step, 2),
        "snapshot / step": round(statistics.median(every) / step, 2),
        "snapshot KB": round(statistics.median(rank["bytes"] for rank in ranks) / 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps)
        return
    steps = args.steps or (8 if args.quick else 60)
    rows = [measure(world, steps) for world in (1, 2)]
    machine = {
        "date": datetime.date.today().isoformat(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "model": f"DDP MLP, {DEPTH} x {WIDTH} + 1, Adam, gloo, OMP_NUM_THREADS=1",
    }
    results = {"machine": machine, "quick": args.quick, "rows": rows}
    columns = [
        "ranks",
        "snapshot, median ms",
        "p25 to p75 ms",
        "per rank median ms",
        "its CPU time, median ms",
    ]
    columns += ["training step ms", "snapshot / step", "snapshot KB"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        per_rank = ", ".join(map(str, row["per rank median ms"]))
        spread = f"{row['p25 ms']} to {row['p75 ms']}"
        cells = [
            row["ranks"],
            row["median ms"],
            spread,
            per_rank,
            row["cpu median ms"],
            row["step ms"],
        ]
        cells += [row["snapshot / step"], row["snapshot KB"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    table = "\n".join(
        [
            f"# Snapshot cost per rank ({machine['date']}, {machine['model']}, torch "
            f"{machine['torch']})",
            "",
            *lines,
            "",
        ]
    )
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "distributed.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "distributed.md").write_text(table)


if __name__ == "__main__":
    main()
