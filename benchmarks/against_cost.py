"""What checking a recording against a reference run costs: ``Recorder(..., against=A)`` over the
same recording without it, whole processes.

    python -m benchmarks.against_cost --out benchmarks/results            # the 2.1M CNN, 5 rounds
    python -m benchmarks.against_cost --quick --out /tmp/against          # seconds, a smoke run

The reference case of the recording overhead (:func:`benchmarks.overhead.bench_process_overhead`):
the 2.1M-parameter CNN, ``3 * window`` steps, a snapshot every 10 steps and a checkpoint every 50,
each configuration in a fresh process (``python -m benchmarks.overhead ... --against A``). Run A
is recorded once first, then each round records B plainly and B against A, in an order that
alternates between rounds; a ratio is the median of the rounds' own ratios (paired: each against
the plain recording of its round), with the rounds' lowest and highest. The loop's time runs from
the built trainee to the end of the last write (the last check included); its CPU time counts
this process's threads (the writer's, which checks, included). B matches A to the end, so every
record is checked: the whole cost, with no early stop.

``--part check`` measures instead what the checking itself takes, in this process: a run A of
``window`` steps recorded, then B against it, with the CPU time of each check counted on the
writer's thread (:meth:`~bisect_repro.record.against.ReferenceCheck.check`, ``time.thread_time``)
against the CPU time of B's loop: a figure a shared machine disturbs far less than wall times.

Writes ``against_cost.json`` into ``--out`` with the machine and its load before and after.
Where it stops: wall times on a machine that may be shared; read the ratios with the load beside
them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bisect_repro import Recorder, RecordOptions, Trainee
from bisect_repro.record.against import ReferenceCheck

from .machine import load_average, machine
from .overhead import _TRAINEES, PROCESS_CHECKPOINT_EVERY
from .timing import FULL, QUICK, Plan

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("recorded", "recorded against A")


def _child(model: str, plan: Plan, steps: int, out: Path, against: Path | None) -> dict[str, Any]:
    """One recording in a fresh process (:mod:`benchmarks.overhead`'s child), its figures and the
    process's wall time."""
    command = [sys.executable, "-m", "benchmarks.overhead", model, "--steps", str(steps)]
    command += ["--every", "10", "--out", str(out)] + (["--quick"] if plan is QUICK else [])
    command += ["--against", str(against)] if against is not None else []
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return {**json.loads(done.stdout.splitlines()[-1]), "process s": time.perf_counter() - start}


def bench_against(
    plan: Plan,
    model: str = "cnn2m",
    rounds: int | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The paired cost of checking against a reference (see the module docstring); ``on_round``
    is given the figures of the rounds done so far after each round."""
    rounds = rounds or plan.runs
    steps = 3 * plan.window
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bisect-repro-against-") as tmp:
        reference = Path(tmp) / "a"
        _child(model, plan, steps, reference, None)
        for run in range(rounds):
            order = CONFIGS if run % 2 == 0 else CONFIGS[::-1]
            for name in order:
                against = reference if name == "recorded against A" else None
                measured = _child(model, plan, steps, Path(tmp) / f"b-{run}", against)
                samples[name].append(measured)
                print(
                    f"{model} round {run + 1}, {name}: loop {measured['loop s']:.2f} s, "
                    f"process {measured['process s']:.2f} s",
                    file=sys.stderr,
                )
            if on_round is not None:
                on_round(_figures(model, steps, samples))
    return _figures(model, steps, samples)


def _figures(model: str, steps: int, samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The medians and paired ratios of the rounds in ``samples``."""

    def ratios(key: str) -> list[float]:
        return sorted(
            b[key] / a[key]
            for a, b in zip(samples["recorded"], samples["recorded against A"], strict=True)
        )

    loop, cpu, process = ratios("loop s"), ratios("loop cpu s"), ratios("process s")
    return {
        "model": model,
        "steps": steps,
        "every": 10,
        "checkpoint_every": PROCESS_CHECKPOINT_EVERY,
        "rounds": len(samples["recorded"]),
        "step ms, recorded": statistics.median(s["loop s"] for s in samples["recorded"])
        / steps
        * 1e3,
        "step ms, recorded against A": statistics.median(
            s["loop s"] for s in samples["recorded against A"]
        )
        / steps
        * 1e3,
        "loop time ratio": statistics.median(loop),
        "loop time ratio, rounds' lowest to highest": f"{loop[0]:.3f} to {loop[-1]:.3f}",
        "loop CPU ratio": statistics.median(cpu),
        "process time ratio": statistics.median(process),
    }


def bench_check_cpu(plan: Plan, model: str = "cnn2m") -> dict[str, Any]:
    """The checking's own CPU time against the loop's (see the module docstring)."""
    spent: list[float] = []
    check = ReferenceCheck.check

    def counted(self: ReferenceCheck, *args: Any, **kwargs: Any) -> None:
        start = time.thread_time()
        try:
            check(self, *args, **kwargs)
        finally:
            spent.append(time.thread_time() - start)

    steps = plan.window
    options = RecordOptions(steps=steps, every=10, checkpoint_every=PROCESS_CHECKPOINT_EVERY)
    with tempfile.TemporaryDirectory(prefix="bisect-repro-against-") as tmp:
        reference = Path(tmp) / "a"
        _loop(_TRAINEES[model](plan, torch.device("cpu")), reference, options, None)
        ReferenceCheck.check = counted  # type: ignore[method-assign]
        try:
            trainee = _TRAINEES[model](plan, torch.device("cpu"))
            loop_cpu = _loop(trainee, Path(tmp) / "b", options, reference)
        finally:
            ReferenceCheck.check = check  # type: ignore[method-assign]
    return {
        "model": model,
        "steps": steps,
        "every": 10,
        "checks": len(spent),
        "check CPU ms, median": statistics.median(spent) * 1e3,
        "check CPU ms a step": sum(spent) / steps * 1e3,
        "loop CPU ms a step": loop_cpu / steps * 1e3,
        "check CPU / loop CPU": sum(spent) / loop_cpu,
    }


def _loop(trainee: Trainee, out: Path, options: RecordOptions, against: Path | None) -> float:
    """Record ``trainee`` into ``out``; the CPU seconds of this process meanwhile."""
    assert trainee.step is not None
    cpu = time.process_time()
    with Recorder(out, trainee, options, against=against) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))
    return time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--part", choices=("processes", "check"), default="processes")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    found: dict[str, Any] = {"machine": machine(torch.device("cpu")), "quick": args.quick}
    found["load average before"] = load_average()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "check":
        found["check"] = bench_check_cpu(plan)
        found["load average after"] = load_average()
        (args.out / "against_check.json").write_text(json.dumps(found, indent=2) + "\n")
        print(json.dumps(found["check"], indent=2))
        return

    def write(figures: dict[str, Any]) -> None:  # after each round: a run cut short keeps them
        found["against"] = figures
        found["load average after"] = load_average()
        (args.out / "against_cost.json").write_text(json.dumps(found, indent=2) + "\n")

    write(bench_against(plan, rounds=args.rounds, on_round=write))
    print(json.dumps(found["against"], indent=2))


if __name__ == "__main__":
    main()
