"""A framework's replica repeats a step in a fresh process, with a spare kept ready: which process
serves which request, on a :class:`Replica` whose processes are simulated (no process is started)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.replica import SPARES, Replica, processes_started
from bisect_repro.serve.protocol import Hello
from bisect_repro.serve.requests import Request, Run, Skip
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

    def request(self, request: Request, progress: Any = None) -> tuple[dict[str, Any], Any]:
        self._check_alive()
        process, step = self.process, request.until if isinstance(request, Skip) else getattr(request, "step", None)
        Simulated.log.append((process.number, request.op, step))
        if isinstance(request, Skip):
            process.at = request.until
            return {"step": process.at}, None
        if isinstance(request, Run):
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


def test_spares_started_at_an_earlier_step_train_on_to_the_step_repeated_and_more_are_started() -> None:
    before = processes_started()
    replica = _replica()
    replica.prefetch(3)  # the last equal snapshot: no step before it is repeated
    replica.skip(5)
    assert replica.run(5).outcome == "process 1"  # the first run of a step: this process
    Simulated.ready.set()
    served = []
    for repeat in range(SPARES + 1):  # repeated: each time a spare, trained from 3 on to 5, then one started at 5 when one was taken
        served.append(int(replica.run(5).outcome.split()[1]))
        assert (served[-1], "skip", 5) in Simulated.log
        assert ((served[-1], "skip", 3) in Simulated.log) == (repeat < SPARES)
    assert len(set(served)) == SPARES + 1 and 1 not in served
    replica.close()
    # the first and the three taken; the spares started after them too, unless the close came first
    assert SPARES + 2 <= processes_started() - before <= 2 * SPARES + 2
    assert Simulated.log[-1][1] == "exit"


def test_a_spare_nobody_takes_is_killed_even_before_it_connects() -> None:
    replica = _replica()
    replica.prefetch(3)
    spares = [spare for spare, _ in replica._spares]
    assert len(spares) == SPARES
    replica.close()  # the spares are still waiting to connect
    Simulated.ready.set()
    assert all(spare.exception(timeout=10) is not None for spare in spares)  # they never served: killed
    assert all(number == 1 for number, _, _ in Simulated.log)


def test_a_spare_is_not_taken_for_a_step_before_its_own() -> None:
    replica = _replica()
    Simulated.ready.set()
    replica.prefetch(6)
    replica.skip(7)
    replica.run(7)
    served = int(replica.run(4).outcome.split()[1])  # the spares stand at 6: a fresh process for 4
    assert served != 1 and (served, "skip", 4) in Simulated.log and (served, "skip", 6) not in Simulated.log
    replica.close()
