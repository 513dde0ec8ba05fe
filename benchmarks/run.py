"""bisect-repro's benchmarks: hash throughput, recording overhead, storage, compare cost.

    python -m benchmarks.run --out benchmarks/results           # CPU: under 10 minutes on 2 cores
    python -m benchmarks.run --out /tmp/bench --device cuda     # the same on a GPU
    python -m benchmarks.run --out /tmp/bench --quick           # tiny sizes: the smoke test
    python -m benchmarks.run --out benchmarks/results --only hash small  # some, keep the others

Writes ``results.json`` and ``results.md`` into ``--out``: the machine, device, versions and
date, then one table per benchmark, each with its own date, commit and load. ``--only`` re-runs
the named benchmarks and keeps the others from the results already in ``--out`` (same device and
plan), so that a machine shared with other work can be measured in its quiet moments. Every
figure is the median of repeated runs, and every ratio compares figures measured in the same
run, interleaved, so that a machine shared with other work slows both sides alike.

- Hash throughput (GB/s) by tensor size, next to the read-bandwidth ceiling ``x.sum()`` (hashing
  reads each byte once, so it cannot beat a plain read), the torch-op path that hashes where the
  C kernel was not built (CPU only), ``torch.hash_tensor`` (an XOR reduction) where this torch has
  it, and on the CPU xxhash's xxh3 (``pip install ".[bench]"``; the column is left out without it).
- Many small tensors: 2,000 tensors of 16 KB hashed in one call, against ``torch.hash_tensor``
  called on each, and against one tensor of the same total size.
- Recording overhead: step time under the recorder over step time without it, every=1 and
  every=10 with a checkpoint every 100 steps; a ~10M-parameter MLP and the CNN example
  (``examples/cnn.py``, 5k parameters, two loader workers) on the CPU, a GPT-style
  ~100M-parameter transformer on CUDA. On the CPU also the whole process: a 2.1M-parameter CNN
  (two loader workers), every=1 and every=10 with a checkpoint every 50 steps, each run in a fresh
  process, against the plain loop in a fresh process (``cnn2m``).
- Storage: bytes per snapshot and per checkpoint against ``torch.save`` of the same state into
  memory (the baseline only: bisect-repro itself never pickles).
- Compare cost: two recorded 2,000-step runs that part ways at step 1,537, compared; the wall time
  against the time to train the steps the replay re-ran, for both runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .compare_cost import bench_compare
from .hash_speed import bench_hash, bench_small_hash
from .machine import cpu_pressure, load_average, machine
from .overhead import bench_overhead, bench_process_overhead
from .report import markdown
from .storage import bench_storage
from .timing import FULL, QUICK

STAGES = ("hash", "small", "mlp", "cnn", "cnn2m", "gpt", "storage", "compare")
SECTIONS = (
    "hash",
    "small",
    "overhead_mlp",
    "overhead_cnn",
    "overhead_cnn2m",
    "overhead_gpt",
    "storage",
    "compare",
)


def _kept_sections(path: Path, device: torch.device, quick: bool) -> dict[str, Any]:
    """The sections of earlier results that a partial run keeps: same device and plan only."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if earlier.get("quick") != quick or earlier.get("machine", {}).get("device") != str(device):
        return {}
    return {name: earlier[name] for name in SECTIONS if name in earlier}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results"),
        help="folder for results.json and results.md",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when present)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, a few seconds: checks that the benchmarks run",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=STAGES,
        metavar="NAME",
        help=f"run only these benchmarks: {', '.join(STAGES)}",
    )
    parser.add_argument(
        "--runs", type=int, help="runs of each recording configuration (default: the plan's)"
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="cnn2m: another checkout (C kernel built in place) recorded in the same rounds",
    )
    args = parser.parse_args(argv)
    chosen = set(args.only or STAGES)
    device = torch.device(args.device)
    plan = QUICK if args.quick else FULL
    plan = dataclasses.replace(plan, runs=args.runs) if args.runs else plan
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(device), "quick": args.quick}
    kept = _kept_sections(args.out / "results.json", device, args.quick) if args.only else {}

    def stage(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if name.removeprefix("overhead_") not in chosen:
            if name in kept:
                results[name] = kept[name]
            return
        t = time.perf_counter()
        load, pressure = load_average(), cpu_pressure()
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        results[name] = fn()
        results[name]["measured"] = {
            "date": date,
            "commit": results["machine"]["commit"],
            "seconds": time.perf_counter() - t,
            "load average at start": load,
            "load average at end": load_average(),
            "cpu pressure at start": pressure,
            "cpu pressure at end": cpu_pressure(),
        }
        print(f"{name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)

    stage("hash", lambda: bench_hash(device, plan))
    stage("small", lambda: bench_small_hash(device, plan))
    stage("overhead_mlp", lambda: bench_overhead(device, plan, "mlp"))
    if device.type == "cpu":
        stage("overhead_cnn", lambda: bench_overhead(device, plan, "cnn"))
        stage("overhead_cnn2m", lambda: bench_process_overhead(plan, base=args.base))
    if device.type == "cuda" or args.quick:  # the quick run exercises the GPT code on the CPU
        stage("overhead_gpt", lambda: bench_process_overhead(plan, "gpt", device))
    elif "gpt" in chosen:
        results["overhead_gpt"] = {"skipped": "needs a CUDA GPU (run with --device cuda)"}
    stage("storage", lambda: bench_storage(device, plan))
    stage("compare", lambda: bench_compare(device, plan))
    results["machine"]["load average at end"] = load_average()
    results["machine"]["cpu pressure at end"] = cpu_pressure()
    results["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(
        markdown(results) + f"\nWhole run: {results['seconds']:.0f} s.\n"
    )
    print(
        f"wrote {args.out / 'results.md'} and results.json in {results['seconds']:.0f} s",
        file=sys.stderr,
    )
    return results


if __name__ == "__main__":
    main()
