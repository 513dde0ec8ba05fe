"""Compare cost: two recorded runs that part ways late, compared, against the training it replays.

The recipe is :mod:`benchmarks.compare_recipe`. Where it stops: the training time is of the steps
the replay re-ran, with the same recipe in this process and no recorder; the replay's own process
start-up is part of the compare time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bisect_repro import RecordOptions

from .timing import FULL, Plan, cycle

__all__ = ["bench_compare"]


def bench_compare(device: torch.device, plan: Plan) -> dict[str, Any]:
    """``compare`` on two recorded runs that part ways near step 1,500 of 2,000 (quick: 37 of 60).

    Its wall time is set against the time to train the steps it replays, for both runs, measured
    in this process with the same recipe and no recorder.
    """
    from bisect_repro import compare, record
    from bisect_repro.record.recipe import build

    full = plan is FULL
    steps, diverge_at, every, checkpoint_every = (2000, 1537, 10, 100) if full else (60, 37, 10, 20)
    target = f"{Path(__file__).with_name('compare_recipe.py')}:build"
    config = {"diverge_at": diverge_at, "width": 512 if full else 64}
    options = RecordOptions(steps=steps, every=every, checkpoint_every=checkpoint_every, force=True)
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        runs = [
            record(build(target, config), Path(tmp) / name, options, target=target, config=config)
            for name in "ab"
        ]
        walls, results = [], []
        for _ in range(3 if full else 1):
            started = time.perf_counter()
            results.append(compare(runs[0], runs[1]))
            walls.append(time.perf_counter() - started)
    result = results[-1]
    replayed = result.replay.replayed_steps
    trainee = build(target, config)
    assert trainee.step is not None
    batches = list(cycle(trainee.loader, replayed + 5))
    for batch in batches[:5]:  # warm-up
        trainee.step(batch)
    train_times = []
    for _ in range(3):
        started = time.perf_counter()
        for batch in batches[5:]:
            trainee.step(batch)
        train_times.append(time.perf_counter() - started)
    train = statistics.median(train_times)
    wall = statistics.median(walls)
    return {
        "steps": steps,
        "diverges_at": diverge_at,
        "found": [
            result.verdict.step,
            result.verdict.phase,
            result.verdict.layer,
            result.verdict.cause.value,
        ]
        if result.verdict
        else None,
        "replayed steps": replayed,
        "compare s": wall,
        "train replayed steps s (one run)": train,
        "ratio to both runs' steps": wall / (2 * train),
        "ratio to one run's steps": wall / train,
        "note": f"compare of two {steps}-step runs diverging at step {diverge_at}, every={every}, "
        f"checkpoint every {checkpoint_every}",
    }
