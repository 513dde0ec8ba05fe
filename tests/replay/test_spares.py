"""A framework's replica repeats a step in a fresh process, with a spare kept ready: which process
serves which request, on a :class:`Replica` whose processes are simulated (no process is started)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.replica import Replica, processes_started
from bisect_repro.serve.protocol import Hello
from bisect_repro.store.meta import CodeKind

SPEC = LaunchSpec(kind=CodeKind.SCRIPT, path="/code/train.py")


class _Process:
    """A simulated process: its number (in start order) and the step it stands at."""

    def __init__(self, number: int) -> None:
        self.number, self.at = number, 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = 0 if self.returncode is None else self.returncode
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


class _Listener:
    def close(self) -> None:
        pass


class Simulated(Replica):
    """A framework's process, simulated: each step runs once, in order; ``ready`` holds a spare's
    start until the test lets it connect; every request is noted in ``log`` with its process."""

    log: ClassVar[list[tuple[int, str, int | None]]] = []
    ready = threading.Event()
    serial = 0

    def _start(self) -> None:
        Simulated.serial += 1
        self.process, self.listener = _Process(Simulated.serial), _Listener()  # type: ignore[assignment]

    def connect(self) -> Hello:
        if self.process.number > 1:  # a spare: connects when the test says so
            assert Simulated.ready.wait(10)
        self.hello = Hello(pid=self.process.number, reruns=False)
        self.channel = object()  # type: ignore[assignment]
        return self.hello

    def request(self, op: str, tree: Any = None, progress: Any = None, **args: Any) -> tuple[dict[str, Any], Any]:
        self._check_alive()
        process, step = self.process, args.get("step", args.get("until"))
        Simulated.log.append((process.number, op, step))
        if op == "skip":
            process.at = args["until"]
            return {"step": process.at}, None
        if op == "run":
            assert step == process.at, f"process {process.number} stands at step {process.at}, asked to run {step}"
            process.at += 1
            return {"step": step, "outcome": f"process {process.number}"}, None
        return {}, None

    def _check_alive(self) -> None:
        assert self.process.poll() is None, f"process {self.process.number} is gone"

    def _last_output(self) -> str:
        return ""

    def _close_connections(self) -> None:
        pass


def _replica() -> Simulated:
    Simulated.log, Simulated.serial = [], 0
    Simulated.ready.clear()
    replica = Simulated(SPEC, "run A")
    replica.connect()
    replica.restore(Path("/runs/a"), 0)
    return replica


def test_a_spare_started_at_an_earlier_step_trains_on_to_the_step_repeated_and_the_next_is_started() -> None:
    before = processes_started()
    replica = _replica()
    replica.prefetch(3)  # the last equal snapshot: no step before it is repeated
    replica.skip(5)
    assert replica.run(5).outcome == "process 1"  # the first run of a step: this process
    Simulated.ready.set()
    assert replica.run(5).outcome == "process 2"  # repeated: the spare, trained from 3 on to 5
    assert (2, "skip", 3) in Simulated.log and (2, "skip", 5) in Simulated.log
    assert replica.run(5).outcome == "process 3"  # and again: the spare started when the first was taken
    replica.close()
    # the first and the two taken; the next spare too, unless the close came before it started
    assert processes_started() - before in (3, 4)
    assert Simulated.log[-1][1] == "exit"


def test_a_spare_nobody_takes_is_killed_even_before_it_connects() -> None:
    replica = _replica()
    replica.prefetch(3)
    spare = replica._spare
    assert spare is not None
    replica.close()  # the spare is still waiting to connect
    Simulated.ready.set()
    assert spare.exception(timeout=10) is not None  # it never served: killed
    assert all(number == 1 for number, _, _ in Simulated.log)


def test_a_spare_is_not_taken_for_a_step_before_its_own() -> None:
    replica = _replica()
    Simulated.ready.set()
    replica.prefetch(6)
    replica.skip(7)
    replica.run(7)
    assert replica.run(4).outcome == "process 3"  # the spare stands at 6: a fresh process for 4
    assert (3, "skip", 4) in Simulated.log
    replica.close()
