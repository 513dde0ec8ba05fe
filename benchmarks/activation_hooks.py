"""What the activation sketches' forward hooks cost on the steps where nothing is taken.

A 50-module MLP (25 Linear layers, each followed by a Tanh) runs a training step's forward and
backward in four states of the same model, on the same input:

- ``plain``: no hook;
- ``idle hooks``: a hook on each leaf module that returns at once, as the sketches' hooks did when
  they stayed in place for the whole recording;
- ``between snapshots``: what the recorder leaves between snapshots now (an
  :class:`~bisect_repro.capture.activations.ActivationSketches` not started: no hook);
- ``taking``: the one step after each snapshot (hooks put on, outputs sampled, sketches queued,
  hooks removed).

Each round times every state in turn, in an order rotated from round to round, the hooks put on
and taken off outside the timed calls; the figure is the median over rounds of the thread's CPU
time per step (on one torch thread: what other work on a shared machine disturbs least).
``between snapshots`` against ``plain`` is the null comparison: the same code twice, which shows
the noise. At a small width (a Python call per module is then the largest share) and a larger one.

    python -m benchmarks.activation_hooks --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bisect_repro.capture.activations import ActivationSketches

from .machine import cpu_pressure, load_average, machine

__all__ = ["bench_hooks", "mlp"]

LAYERS = 25  # Linear + Tanh each: 50 leaf modules
SIDES = ("plain", "idle hooks", "between snapshots", "taking")


def mlp(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *[module for _ in range(LAYERS) for module in (nn.Linear(width, width), nn.Tanh())]
    )


@contextmanager
def _idle_hooks(model: nn.Module) -> Iterator[None]:
    """A hook on every leaf that returns at once (one Python call per module per forward)."""
    active = False

    def hook(module: nn.Module, inputs: Any, output: Any) -> None:
        if not active:
            return

    handles = [
        m.register_forward_hook(hook)
        for name, m in model.named_modules()
        if name and next(m.children(), None) is None
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _cpu_seconds(fn: Callable[[], None], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls


def bench_hooks(width: int, batch: int, rounds: int, calls: int) -> dict[str, Any]:
    model, x = mlp(width), torch.randn(batch, width)
    sketches = ActivationSketches(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    def taking() -> None:
        sketches.start()
        step()
        sketches.take()

    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(3):
        taking()  # warm up: allocator, the sketch tables
    for turn in range(rounds):
        for side in SIDES[turn % len(SIDES) :] + SIDES[: turn % len(SIDES)]:
            if side == "idle hooks":
                with _idle_hooks(model):
                    samples[side].append(_cpu_seconds(step, calls))
            else:
                samples[side].append(_cpu_seconds(taking if side == "taking" else step, calls))
    medians = {side: statistics.median(values) for side, values in samples.items()}
    base = medians["plain"]
    return {
        "width": width,
        "batch": batch,
        "modules": 2 * LAYERS,
        "rounds": rounds,
        **{f"{side} ms": round(seconds * 1e3, 4) for side, seconds in medians.items()},
        **{f"{side} / plain": round(medians[side] / base, 4) for side in SIDES[1:]},
        "idle hooks, per module per forward, us": round(
            (medians["idle hooks"] - base) / (2 * LAYERS) * 1e6, 3
        ),
        "load after": load_average(),
        "cpu pressure after": cpu_pressure(),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for activation_hooks.json")
    parser.add_argument(
        "--rounds", type=int, default=41, help="rounds, each timing every state in turn"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        bench_hooks(width, batch, args.rounds, calls)
        for (width, batch), calls in (((32, 8), 200), ((256, 64), 20))
    ]
    report = {"machine": machine(torch.device("cpu")), "rows": rows}
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "activation_hooks.json").write_text(json.dumps(report, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
