"""Recording overhead: time under the recorder over time without it, two ways.

- :func:`bench_overhead`, per step: each configuration (no recorder, every=10, every=1; a
  checkpoint every 100 steps) is run in turn, from a freshly built trainee, so that a machine
  shared with other work slows them alike. Where it stops: the timed window is steps 1 to
  ``window``; step 0 (the first checkpoint, and the warm-up) and the final close are outside it.
- :func:`bench_process_overhead`, whole process: each configuration (the plain loop, every=10,
  every=1; a checkpoint every 50 steps) runs ``3 * window`` steps in a fresh process of its own
  (``python -m benchmarks.overhead``), plain and recorded in turn, in rounds; a ratio is the median
  of the rounds' own ratios (each round's plain loop is its baseline). The loop's time runs from the
  built trainee to the end of the last write (``close()`` waits for the writer): the recorder's
  start, every snapshot and checkpoint and the final drain are inside it; the process's time adds
  the interpreter's start, the imports and building the trainee, which both sides pay alike. The
  loop's CPU time (the process's threads, not the loader's workers) is less disturbed by other
  work on a shared machine than its wall time. The recorder's own CPU (its calls on the training
  thread and its writer thread, counted by thread: :func:`_account_recorder`), a median in seconds,
  is the least disturbed of all: what the recorder spends, not what it costs the training by
  sharing its cores (the plain loop's own CPU varied by 40% between rounds on a 2-core machine,
  so it is set against the plain loop's median, not paired by round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bisect_repro import Recorder, RecordOptions, Trainee
from bisect_repro.record.background import BackgroundWriter
from bisect_repro.record.session import RecordingSession

from .timing import FULL, QUICK, Plan, cycle, sync
from .trainees import cnn2m_trainee, cnn_trainee, gpt_trainee, mlp_trainee

__all__ = ["bench_overhead", "bench_process_overhead"]


def _timed_window(
    trainee: Trainee, device: torch.device, plan: Plan, options: RecordOptions | None, out: Path
) -> float:
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
                samples[name].append(
                    _timed_window(trainee, device, plan, options, Path(tmp) / f"{name}-{run}")
                )
    base = statistics.median(samples["no recorder"])
    params = sum(
        p.numel()
        for p in make(
            plan, torch.device("cpu") if device.type != "cuda" else device
        ).model.parameters()
    )
    rows = [
        {
            "configuration": name,
            "step ms": statistics.median(values) * 1e3,
            "overhead": statistics.median(values) / base,
            "runs": len(values),
        }
        for name, values in samples.items()
    ]
    return {
        "model": model,
        "parameters": params,
        "steps timed per run": plan.window,
        "checkpoint_every": 100,
        "rows": rows,
    }


PROCESS_CHECKPOINT_EVERY = 50
_TRAINEES = {"cnn2m": cnn2m_trainee, "gpt": gpt_trainee}


_SESSION_CALLS = ("begin_step", "note_batch", "end_step", "log", "close")


def _account_recorder() -> dict[str, float]:
    """Count the CPU seconds the recorder takes from here on: its calls on the training thread
    (:data:`_SESSION_CALLS` of the recording session, by wrapping them) and its writer thread's
    whole life. Where it stops: the hash kernel's second thread, the loader's workers and what the
    recorder's work costs the training by sharing its cores (caches, a worker thread preempted) are
    not counted; those show only in the loop's time."""
    counted = {"recorder cpu s": 0.0, "writer cpu s": 0.0}

    def timed(function: Any, key: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                counted[key] += time.thread_time() - start

        return call

    for name in _SESSION_CALLS:
        setattr(RecordingSession, name, timed(getattr(RecordingSession, name), "recorder cpu s"))
    BackgroundWriter._work = timed(BackgroundWriter._work, "writer cpu s")  # type: ignore[method-assign]
    return counted


def _process_child(
    model: str,
    quick: bool,
    steps: int,
    every: int,
    out: Path | None,
    device: torch.device,
    against: Path | None = None,
) -> dict[str, float]:
    """One configuration in this process: the loop's seconds, from the built trainee to the last
    write (and the device's last kernel), the CPU seconds of this process's threads meanwhile
    (not the loader's workers), and when recording the recorder's own
    (:func:`_account_recorder`). ``against``: record against that reference run
    (:mod:`benchmarks.against_cost`)."""
    plan = QUICK if quick else FULL
    trainee = _TRAINEES[model](plan, device)
    assert trainee.step is not None
    counted = _account_recorder() if out is not None else {}
    start, cpu = time.perf_counter(), time.process_time()
    if out is None:
        for batch in cycle(trainee.loader, steps):
            trainee.step(batch)
    else:
        options = RecordOptions(
            steps=steps, every=every, checkpoint_every=PROCESS_CHECKPOINT_EVERY, force=True
        )
        with Recorder(out, trainee, options, against=against) as recorder:
            for batch in recorder.batches():
                recorder.log(trainee.step(batch))
    sync(device)
    return {
        "loop s": time.perf_counter() - start,
        "loop cpu s": time.process_time() - cpu,
        **counted,
    }


def bench_process_overhead(
    plan: Plan, model: str = "cnn2m", device: torch.device | None = None, base: Path | None = None
) -> dict[str, Any]:
    """The whole-process overhead (see the module docstring), over ``plan.runs`` rounds: each round
    runs every configuration once in a fresh process, starting one configuration later in the order
    than the round before (no configuration always runs first, or right after another); each
    ratio is the median over rounds of the round's own ratio (paired: a configuration against the
    plain loop of the same round, a minute apart at most), with the rounds' lowest and highest.
    ``base``: another checkout of bisect-repro (its C kernel built in place), whose recorder runs
    every=10 and every=1 too, in the same rounds: the two versions' ratios measured side by side."""
    device = device or torch.device("cpu")
    steps = 3 * plan.window
    configs: dict[str, int | None] = {"plain loop": None, "every=10": 10, "every=1": 1}
    if base is not None:
        configs |= {"every=10, base": 10, "every=1, base": 1}
    names = list(configs)
    here = Path(__file__).resolve().parent.parent
    loops: dict[str, list[float]] = {name: [] for name in configs}
    cpus: dict[str, list[float]] = {name: [] for name in configs}
    processes: dict[str, list[float]] = {name: [] for name in configs}
    # the recorder's counted CPU seconds
    own: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        for run in range(plan.runs):
            for name in names[run % len(names) :] + names[: run % len(names)]:
                every = configs[name]
                command = [
                    sys.executable,
                    "-m",
                    "benchmarks.overhead",
                    model,
                    "--steps",
                    str(steps),
                    "--device",
                    str(device),
                ]
                command += ["--quick"] if plan is QUICK else []
                command += (
                    []
                    if every is None
                    else [
                        "--every",
                        str(every),
                        "--out",
                        str(Path(tmp) / f"{names.index(name)}-{run}"),
                    ]
                )
                start = time.perf_counter()
                # its bisect_repro is imported first
                where = base if base is not None and name.endswith(", base") else here
                done = subprocess.run(
                    command, cwd=where, capture_output=True, text=True, check=True
                )
                processes[name].append(time.perf_counter() - start)
                measured = json.loads(done.stdout.splitlines()[-1])
                loops[name].append(measured["loop s"])
                cpus[name].append(measured["loop cpu s"])
                own[name].append(
                    measured.get("recorder cpu s", 0.0) + measured.get("writer cpu s", 0.0)
                )
                # Each process as it ends, so that a run cut short still leaves its figures in the
                # log.
                took = f"process {processes[name][-1]:.2f} s, loop {measured['loop s']:.2f} s"
                print(f"{model} round {run + 1}, {name}: {took}", file=sys.stderr)

    def paired(samples: dict[str, list[float]], name: str) -> list[float]:
        return sorted(a / b for a, b in zip(samples[name], samples["plain loop"], strict=True))

    rows = []
    for name in configs:
        process_ratios = paired(processes, name)
        rows.append(
            {
                "configuration": name,
                "step ms": statistics.median(loops[name]) / steps * 1e3,
                "loop overhead": statistics.median(paired(loops, name)),
                "loop CPU overhead": statistics.median(paired(cpus, name)),
                "recorder's own CPU ms a step": statistics.median(own[name]) / steps * 1e3,
                "recorder's own CPU / plain loop CPU": statistics.median(own[name])
                / statistics.median(cpus["plain loop"]),
                "process s": statistics.median(processes[name]),
                "process s, lowest to highest": f"{min(processes[name]):.2f} to "
                f"{max(processes[name]):.2f}",
                "process overhead": statistics.median(process_ratios),
                "process overhead, rounds' lowest to highest": f"{process_ratios[0]:.3f} to "
                f"{process_ratios[-1]:.3f}",
                "runs": plan.runs,
            }
        )
    # built on the CPU: the count only
    params = sum(p.numel() for p in _TRAINEES[model](plan, torch.device("cpu")).model.parameters())
    found = {
        "model": model,
        "parameters": params,
        "steps": steps,
        "checkpoint_every": PROCESS_CHECKPOINT_EVERY,
        "rows": rows,
    }
    return found | ({"base": _commit_of(base)} if base is not None else {})


def _commit_of(folder: Path) -> str:
    """The base checkout's commit where it is a git checkout, else its path."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or str(folder)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="One configuration of the whole-process overhead benchmark, in this process."
    )
    parser.add_argument("model", choices=sorted(_TRAINEES))
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--out", type=Path, help="record into this folder (none: the plain loop)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--against", type=Path, help="record against this reference run")
    args = parser.parse_args()
    print(
        json.dumps(
            _process_child(
                args.model,
                args.quick,
                args.steps,
                args.every,
                args.out,
                torch.device(args.device),
                args.against,
            )
        )
    )
