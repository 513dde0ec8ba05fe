"""How the benchmarks size and time their work: the two plans, and medians of interleaved samples.

Every figure is the median of repeated samples; functions compared with each other are sampled in
turn (:func:`interleaved_medians`), so that a machine shared with other work slows each side alike.
On CUDA every sample waits for the device. Where the figures stop: they are wall times on a
machine that may be shared; the load around each section is recorded beside it (see
:mod:`benchmarks.machine`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FULL", "QUICK", "Plan", "cycle", "interleaved_medians", "sync"]


@dataclass(frozen=True)
class Plan:
    """How big and how long: the full run, or the seconds-long smoke run."""

    sizes_mb: tuple[float, ...]
    small: tuple[int, int]  # many small tensors: how many, and bytes each
    repeats: int
    min_seconds: float  # each timed sample repeats the call until it has run this long
    mlp_widths: tuple[int, ...]
    gpt: dict[str, int]
    batch: int
    window: int  # steps timed per recording run
    runs: int  # recording runs per configuration


FULL = Plan(
    sizes_mb=(1, 4, 16, 64, 256, 1024),
    small=(2000, 16 << 10),
    repeats=7,
    min_seconds=0.05,
    mlp_widths=(1024, 2048, 2048, 1024, 1024),  # 9.4M parameters
    # 110M parameters
    gpt={"vocab": 32000, "width": 768, "layers": 12, "heads": 12, "context": 512, "batch": 8},
    batch=64,
    window=100,  # one checkpoint and ten snapshots at every=10
    runs=5,
)
QUICK = Plan(
    sizes_mb=(0.25, 1),
    small=(50, 16 << 10),
    repeats=3,
    min_seconds=0.005,
    mlp_widths=(64, 64, 32),
    gpt={"vocab": 256, "width": 64, "layers": 2, "heads": 2, "context": 32, "batch": 2},
    batch=8,
    window=8,
    runs=1,
)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sample(fn: Callable[[], object], device: torch.device, min_seconds: float) -> float:
    """Seconds per call: the call repeated until ``min_seconds`` have passed, then averaged."""
    calls = 0
    sync(device)
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def interleaved_medians(
    fns: dict[str, Callable[[], object]], device: torch.device, plan: Plan
) -> dict[str, float]:
    """Median seconds per call of each function, sampled in turn so that they share the machine's
    moods."""
    for fn in fns.values():  # warm up: caches, lazily built tables, compiled kernels
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(plan.repeats):
        for name, fn in fns.items():
            samples[name].append(_sample(fn, device, plan.min_seconds))
    return {name: statistics.median(values) for name, values in samples.items()}


def cycle(loader: Any, count: int) -> Any:
    """``count`` batches of the loader, epoch after epoch."""
    done = 0
    while True:
        for batch in loader:
            if done == count:
                return
            yield batch
            done += 1
