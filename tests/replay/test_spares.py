"""A framework's replica repeats a step in a fresh process, with a spare kept ready: which process
serves which request, on a :class:`Replica` whose processes are simulated (no process is
started)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.replica import SPARES, Replica, ReplicaFailed, processes_started
from bisect_repro.serve.protocol import Hello
from bisect_repro.serve.requests import Asks, Exit, Restore, Rewind, Run, Skip
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

    def _exchange(self, request: Asks[Any], progress: Any = None) -> tuple[dict[str, Any], Any]:
        self._check_alive()
        process, step = (
            self.process,
            request.until if isinstance(request, Skip) else getattr(request, "step", None),
        )
        Simulated.log.append((process.number, request.op, step))
        if isinstance(request, Skip):
            process.at = request.until
            return {"step": process.at}, None
        if isinstance(request, Run):
            assert step == process.at, (
                f"process {process.number} stands at step {process.at}, asked to run {step}"
            )
            process.at += 1
            return {"step": step, "outcome": f"process {process.number}"}, None
        if isinstance(request, Restore):
            return {"step": request.step}, None
        # fetch, exit
        return ({"ok": True} if isinstance(request, Exit) else {"step": process.at}), None

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


def test_spares_started_at_an_earlier_step_train_on_to_the_step_repeated_and_more_are_started() -> (
    None
):
    before = processes_started()
    replica = _replica()
    replica.prefetch(3)  # the last equal snapshot: no step before it is repeated
    replica.skip(5)
    assert replica.run(5).outcome == "process 1"  # the first run of a step: this process
    Simulated.ready.set()
    served = []
    # repeated: each time a spare, trained from 3 on to 5, then one started at 5 when one was taken
    for repeat in range(SPARES + 1):
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
    # they never served: killed
    assert all(spare.exception(timeout=10) is not None for spare in spares)
    assert all(number == 1 for number, _, _ in Simulated.log)


def test_a_spare_is_not_taken_for_a_step_before_its_own() -> None:
    replica = _replica()
    Simulated.ready.set()
    replica.prefetch(6)
    replica.skip(7)
    replica.run(7)
    served = int(replica.run(4).outcome.split()[1])  # the spares stand at 6: a fresh process for 4
    assert (
        served != 1
        and (served, "skip", 4) in Simulated.log
        and (served, "skip", 6) not in Simulated.log
    )
    replica.close()


class Rewinding(Simulated):
    """An unchanged script's process, simulated: it also rewinds to the step it ran last."""

    def connect(self) -> Hello:
        super().connect()
        self.hello = Hello(pid=self.process.number, reruns=False, rewinds=True)
        return self.hello

    ends_after: ClassVar[int | None] = None
    """The rewinds after which the script's loop ends (a counter of its own that each rewind
    moves)."""

    def _exchange(self, request: Asks[Any], progress: Any = None) -> tuple[dict[str, Any], Any]:
        process = self.process
        rewinds = sum(
            1 for number, done, _ in Simulated.log if number == process.number and done == "rewind"
        )
        if (
            isinstance(request, Run)
            and process.number == 1
            and Rewinding.ends_after is not None
            and rewinds > Rewinding.ends_after
        ):
            process.returncode = 0
            raise ReplicaFailed(
                "replay of run A: training ended after step 6; the replay cannot go further"
            )
        if not isinstance(request, Rewind):
            return super()._exchange(request, progress)
        Simulated.log.append((process.number, request.op, request.step))
        assert request.step == process.at - 1, (
            f"process {process.number} stands at step {process.at}, asked to rewind to "
            f"{request.step}"
        )
        process.at = request.step
        return {"step": process.at, "consumes": True}, None


def _rewinding(verified: int | None) -> Rewinding:
    Simulated.log, Simulated.serial = [], 0
    Simulated.ready.set()
    replica = Rewinding(SPEC, "run A")
    replica.connect()
    replica.restore(Path("/runs/a"), 0)
    replica.prefetch(3)
    replica.skip(5)
    replica.run(5)
    if verified is not None:
        replica.rewinds.consumes = replica.rewind(verified)
        replica.run(verified)
        replica.rewinds.step = verified
    return replica


def test_a_verified_rewind_serves_plain_repeats_in_its_one_process_and_starts_no_spare() -> None:
    replica = _rewinding(verified=5)
    assert not replica._spares  # none while a rewind may serve
    assert [replica.run(5).outcome for _ in range(3)] == ["process 1"] * 3
    # the check's and the three repeats'
    assert [op for number, op, _ in Simulated.log if number == 1].count("rewind") == 4
    # under other streams, where the step's data draws moved a stream: a fresh process draws the
    # data under them
    assert replica.run(5, streams={"torch": {}}).outcome != "process 1"
    # the fresh process has no verified rewind
    assert replica.run(5).outcome != "process 1" and replica.rewinds.step is None
    # from now on spares are kept ready, as for a framework's run
    assert replica.rewinds.refused and replica._spares
    replica.close()


def test_without_a_verified_rewind_each_repeat_is_a_fresh_process() -> None:
    replica = _rewinding(verified=None)
    assert not replica._spares
    replica.rewinds.refused = True  # the check failed: spares as for a framework's run
    replica.prefetch(5)
    assert len(replica._spares) == SPARES
    assert replica.run(5).outcome != "process 1" and all(
        op != "rewind" for _, op, _ in Simulated.log
    )
    replica.close()


def test_a_script_whose_loop_ends_while_rewound_runs_that_repeat_and_the_next_afresh() -> None:
    replica = _rewinding(verified=5)
    Rewinding.ends_after = 2
    try:
        served = [replica.run(5).outcome for _ in range(3)]
    finally:
        Rewinding.ends_after = None
    assert served[0] == "process 1" and served[1] != "process 1" and served[2] != "process 1", (
        served
    )
    assert replica.rewinds.refused and replica.rewinds.step is None
    # for the report's note
    assert (
        replica.rewinds.stopped is not None
        and "training ended after step 6" in replica.rewinds.stopped
    )
    replica.close()
