"""Where an unchanged script's recording spends its time, by part, in one recorded process.

    python -m benchmarks.script_breakdown --every 10 --checkpoint-every 50 -- \\
        benchmarks/late_cnn.py --steps 200 --reseed-at 1000000

Runs the script under the hooks of ``bisect-repro record -- python ...`` in this process (as
:func:`bisect_repro.record.script.main` does) and prints one JSON object: the wall seconds of the
recorder's start (importing the hooks and the recorder, installing them, opening the run) and of
its exit (the final snapshot and the wait for the writer), and the CPU seconds of each part of the
recorder on the training thread, each counted without the parts it calls (``thread_time``):

- ``opening the run``: at the model's first forward, the recorder made and the run's folder and
  metadata written;
- ``hooks``: torch's hooks the script runs through (each module's forward, the optimizer's step,
  ``backward``), less what they call below;
- ``step log``: noting each step's batch and loss (the batch's tensors queued for hashing);
- ``snapshots``: hashing the state and queueing each snapshot, less the checkpoints' host copies;
- ``checkpoints``: the host copies of each checkpoint's tensors;

and the writer's thread's CPU (``writer``: the digests, encoding, compression, writes and fsyncs).
With ``--profile``, the recorder's functions that took the most time on their own (cProfile's
``tottime``) are listed too. Where it stops: the CPU the recorder's work takes from the training
by sharing its cores (a thread of torch's waiting for the writer's) shows only in the whole-process
wall time that :mod:`benchmarks.script_cost` measures.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

_HOOKS = ("_forward", "_output", "_stepped", "_next_step")
_STEP_LOG = ("note_batch", "log")


class _Exclusive:
    """CPU seconds by part on the training thread, each part's time without the wrapped calls it
    makes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []
        self._main = threading.main_thread()

    def wrap(self, owner: Any, name: str, part: str) -> None:
        function = getattr(owner, name)
        counter = self

        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not counter._main:
                return function(*args, **kwargs)
            frame = [time.thread_time(), 0.0]
            counter._stack.append(frame)
            try:
                return function(*args, **kwargs)
            finally:
                counter._stack.pop()
                took = time.thread_time() - frame[0]
                counter.seconds[part] = counter.seconds.get(part, 0.0) + took - frame[1]
                if counter._stack:
                    counter._stack[-1][1] += took

        setattr(owner, name, call)


def _profiled(profile: cProfile.Profile, top: int) -> list[dict[str, Any]]:
    """The recorder's functions by their own time, most first."""
    stats = pstats.Stats(profile)
    rows = [
        {"function": f"{Path(file).name}:{line}({name})", "calls": calls, "own s": round(own, 3)}
        for (file, line, name), (_, calls, own, _, _) in stats.stats.items()  # type: ignore[attr-defined]
        if "bisect_repro" in file
    ]
    return sorted(rows, key=lambda row: -row["own s"])[:top]


def _instrument() -> tuple[_Exclusive, list[float]]:
    """The recorder's parts counted on the training thread, and its writer's CPU (once it ends)."""
    from bisect_repro.record import background, session
    from bisect_repro.record.autohooks import AutoHooks
    from bisect_repro.store import codec

    counted = _Exclusive()
    for name in _HOOKS:
        counted.wrap(AutoHooks, name, "hooks")
    for name in _STEP_LOG:
        counted.wrap(session.RecordingSession, name, "step log")
    counted.wrap(session.RecordingSession, "__init__", "opening the run")
    counted.wrap(session.RecordingSession, "_snapshot", "snapshots")
    counted.wrap(codec, "prepare", "checkpoints")  # the writer's thread's calls are not counted
    writer: list[float] = []
    work = background.BackgroundWriter._work

    def written(self: background.BackgroundWriter) -> None:
        try:
            work(self)
        finally:
            writer.append(time.thread_time())

    background.BackgroundWriter._work = written  # type: ignore[method-assign]
    return counted, writer


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bisect-repro-breakdown"))
    parser.add_argument("--profile", action="store_true", help="also list cProfile's top functions")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS")
    args = parser.parse_args(argv)
    words = [w for w in args.script if w != "--"]
    import torch  # the script imports it too: not the recorder's start

    del torch
    started = time.perf_counter()
    from bisect_repro.record.arguments import capture_arguments
    from bisect_repro.record.autohooks import AutoHooks
    from bisect_repro.record.options import RecordOptions
    from bisect_repro.record.script import parse_command, run_as_main

    counted, writer = _instrument()
    command = parse_command([sys.executable, *words])
    options = RecordOptions(every=args.every, checkpoint_every=args.checkpoint_every, force=True)
    hooks = AutoHooks(args.out, options).install()
    read_arguments = capture_arguments(hooks.config, command.argv)
    profile = cProfile.Profile() if args.profile else None
    start_s = time.perf_counter() - started
    process_cpu, wall = time.process_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    try:
        run_as_main(command)
    except SystemExit:
        pass
    finally:
        read_arguments()
    closing = time.perf_counter()
    hooks.close()
    if profile is not None:
        profile.disable()
    ended = time.perf_counter()
    found: dict[str, Any] = {
        "options": {k: v for k, v in asdict(options).items() if k in ("every", "checkpoint_every")},
        "command": words,
        "start wall s": round(start_s, 3),
        "script wall s": round(closing - wall, 3),
        "exit wall s": round(ended - closing, 3),
        "process cpu s": round(time.process_time() - process_cpu, 3),
        "training thread cpu s by part": {k: round(v, 3) for k, v in counted.seconds.items()},
        "writer thread cpu s": round(sum(writer), 3),
    }
    if profile is not None:
        found["profile: the recorder's functions by own time"] = _profiled(profile, 15)
    return found


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
