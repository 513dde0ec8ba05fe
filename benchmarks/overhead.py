"""Recording overhead: mean step time under the recorder over mean step time without it.

Each configuration (no recorder, every=10, every=1; a checkpoint every 100 steps) is run in turn,
from a freshly built trainee, so that a machine shared with other work slows them alike. Where it
stops: the timed window is steps 1 to ``window``; step 0 (the first checkpoint, and the warm-up)
and the final close are outside it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bisect_repro import Recorder, RecordOptions, Trainee

from .timing import Plan, cycle, sync
from .trainees import cnn_trainee, gpt_trainee, mlp_trainee

__all__ = ["bench_overhead"]


def _timed_window(trainee: Trainee, device: torch.device, plan: Plan, options: RecordOptions | None, out: Path) -> float:
    """Mean seconds per step over steps 1 .. window (after step 0's checkpoint and warm-up).

    The window holds ``window / every`` snapshots and ``window / 100`` checkpoints, the same
    share as a long run; step 0 (the first checkpoint) and the final close are outside it.
    """
    assert trainee.step is not None
    marks: list[float] = []
    total = plan.window + 2
    if options is None:
        batches = cycle(trainee.loader, total)
        for batch in batches:
            sync(device)
            marks.append(time.perf_counter())
            trainee.step(batch)
    else:
        with Recorder(out, trainee, options) as recorder:
            for batch in recorder.batches():
                sync(device)
                marks.append(time.perf_counter())
                recorder.log(trainee.step(batch))
    return (marks[1 + plan.window] - marks[1]) / plan.window


def bench_overhead(device: torch.device, plan: Plan, model: str) -> dict[str, Any]:
    make = {"mlp": mlp_trainee, "gpt": gpt_trainee, "cnn": cnn_trainee}[model]
    configs: dict[str, RecordOptions | None] = {
        "no recorder": None,
        "every=10": RecordOptions(steps=plan.window + 2, every=10, checkpoint_every=100),
        "every=1": RecordOptions(steps=plan.window + 2, every=1, checkpoint_every=100),
    }
    samples: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        for run in range(plan.runs):
            for name, options in configs.items():  # interleaved: the machine's moods hit all alike
                trainee = make(plan, device)
                samples[name].append(_timed_window(trainee, device, plan, options, Path(tmp) / f"{name}-{run}"))
    base = statistics.median(samples["no recorder"])
    params = sum(p.numel() for p in make(plan, torch.device("cpu") if device.type != "cuda" else device).model.parameters())
    rows = [
        {
            "configuration": name,
            "step ms": statistics.median(values) * 1e3,
            "overhead": statistics.median(values) / base,
            "runs": len(values),
        }
        for name, values in samples.items()
    ]
    return {"model": model, "parameters": params, "steps timed per run": plan.window, "checkpoint_every": 100, "rows": rows}
