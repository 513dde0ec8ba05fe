"""A replica: one run replaying in its own process, steered from here.

:class:`Replica` starts ``python -m bisect_repro.replay.bootstrap`` for a
:class:`~bisect_repro.replay.launch.LaunchSpec` (the recorded script or recipe, with the recorded
environment variables), waits for its Recorder to connect back, and sends it typed requests,
returning typed replies (:mod:`bisect_repro.serve.protocol`). Each replica is its own process, so
two runs never share a random stream, a setting or a module global, and environment variables read
at start-up (``OMP_NUM_THREADS``, ``CUBLAS_WORKSPACE_CONFIG``, ``PYTHONHASHSEED``) are the recorded
ones (those :data:`~bisect_repro.replay.launch.REPLAYED_VARIABLES` allows, and no other). The
process starts in the listener's private folder, never in the recorded working directory, so that
nothing there is imported; the bootstrap moves to that directory once the import path is fixed.

A distributed run's replica is a :class:`~bisect_repro.replay.ranked.RankedReplica` (all its ranks
under ``torchrun``, replying for one rank; :func:`~bisect_repro.replay.ranked.start_replica`). Every
wait on a reply has a deadline proportional to the recorded step time
(:mod:`~bisect_repro.replay.deadline`).

Inside :func:`~bisect_repro.replay.forks.forking` (``compare`` replays inside it), a replica's
process is forked from a fork server that has already imported torch and what the code imports,
instead of starting Python afresh (see :mod:`~bisect_repro.replay.forks`). The replicas' requests
take the cores in turn where their threads would not fit together
(:mod:`~bisect_repro.replay.cores`).

A run whose framework runs each step once per process (``reruns`` false), or whose loop a repeat in
one process would not put back (:meth:`Replica.repeat_afresh`), repeats a step in a fresh process,
restored and replayed to it, unless its process is an unchanged script's, shown to rewind faithfully
(:mod:`~bisect_repro.replay.rewind`). :data:`SPARES` fresh processes are kept ready (spares, none
while a rewind may serve): :meth:`Replica.prefetch` starts them once the replay knows a step the
experiments cannot start before (the last equal snapshot), each spare taken starts another; a spare
stands at or before the step it is taken for and trains on to it. A spare nobody takes is killed
when the replica closes, even mid-start. Every process started is counted
(:func:`processes_started`), which compare reports.

Where the guarantees stop: the replica's output goes to a log file, whose last lines are quoted when
the process dies or never connects (the script fails, or never builds a Recorder).
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..capture.compiled import CompileCall
from ..errors import BisectReproError
from ..serve import requests
from ..serve.channel import Channel, ChannelClosed, Listener
from ..serve.protocol import Description, Fetched, Hello, SkipResult, StepResult, StepStart
from ..serve.replies import Refused, decode_reply
from ..serve.requests import Asks, Trace, encode
from .bootstrap import SPEC_VARIABLE
from .cores import CORES
from .deadline import Deadline, DeadlinePassed, allowance, guarded
from .forks import ForkedProcess, start_process
from .interface import Progress
from .launch import LaunchSpec
from .output import last_line
from .prestart import replica_environment
from .rewind import Rewinds

_log = logging.getLogger(__name__)

__all__ = ["Replica", "ReplicaFailed", "processes_started"]


R = TypeVar("R")

_STARTS: list[None] = []
"""One item per replaying process started (a distributed run's launcher counting as one); appending
is atomic."""

SPARES = 2
"""Spare processes kept under way for a run whose framework runs each step once per process: an
experiment usually repeats a step at once, and the next soon after."""


def processes_started() -> int:
    """How many replaying processes (a distributed run's launcher counting as one) this process has
    started so far."""
    return len(_STARTS)


class ReplicaFailed(BisectReproError):
    """The replaying process died or could not start; the message quotes its last output."""


class Replica:
    """One replaying process (see the module docstring). Start several, then :meth:`connect`
    each."""

    process: subprocess.Popen[bytes] | ForkedProcess
    """The replaying process: started afresh, or forked from a fork server (inside
    ``forking()``)."""

    def __init__(self, spec: LaunchSpec, label: str) -> None:
        self.spec, self.label = spec, label
        self.channel: Channel | None = None
        self.hello: Hello | None = None
        self.step: int | None = None
        self._restored: tuple[Path, int, dict[str, Any] | None] | None = None
        self._pool = ThreadPoolExecutor(SPARES)
        # under way or ready, oldest first, with their steps
        self._spares: list[tuple[Future[Replica], int]] = []
        # being started now (killed when the replica closes first)
        self._starting: set[Replica] = set()
        self._spare_lock = threading.Lock()
        # spare: being prepared, its requests yield the cores to the replay's
        self._closing, self.spare = False, False
        self.afresh = False
        """Each repeat of a step runs in a fresh process, though this one could run it again
        (:meth:`repeat_afresh`)."""
        # the step whose repeats rewind this process instead of taking a fresh one (rewind.py)
        self.rewinds = Rewinds()
        _STARTS.append(None)
        self._start()

    def _environment(self) -> dict[str, str]:
        """The environment the process starts with: this one's, with the run's recorded variables
        and the channel's."""
        # REPLAYED_VARIABLES only (see launch.py)
        environment = replica_environment(self.spec.variables)
        environment.update(self.listener.environment())
        environment[SPEC_VARIABLE] = json.dumps(self.spec.to_json())
        return environment

    def _start(self) -> None:
        self.listener = Listener()
        self.log = Path(self.listener.folder) / "output.log"
        # this process's own: the rest is a fork server's
        private = {*self.listener.environment(), SPEC_VARIABLE}
        where = (self.spec.path, self.spec.cwd, self.spec.root)
        label = f"replay of {self.label} ({self.spec.describe()})"
        self.process = start_process(
            self._environment(), private, where, str(self.listener.folder), self.log, label
        )

    @property
    def reruns(self) -> bool:
        """Whether a step can run again in this process (``False``: a framework's loop, whose
        repeats this class starts)."""
        return (self.hello is None or self.hello.reruns) and not self.afresh

    def repeat_afresh(self, first: int) -> None:
        """From now on run each repeat of a step in a fresh process restored at checkpoint ``first``
        and replayed to the step, as a framework's steps are: for a loop whose own state (a local
        counter such as ``enumerate``'s) a repeat in one process does not put back."""
        assert self._restored is not None, "restore() first"
        path, _, environment = self._restored
        self._restored, self.afresh = (path, first, environment), True

    def _to_start_of(self, step: int, *, plain: bool = True, compiles: bool = False) -> bool:
        """In a process that runs each step once (a framework's), stand at the start of ``step``: go
        on from here, rewind (:mod:`~bisect_repro.replay.rewind`), or take a fresh process replayed
        to it."""
        if self.reruns or self.step == step:
            return False
        if self.step == step + 1 and self.rewinds.serves(step, plain=plain, compiles=compiles):
            self.rewind(step)
            return True
        if self.step is not None and self.step < step:
            self.skip(step)
            return False
        usable = next((i for i, (_, at) in enumerate(self._spares) if at <= step), None)
        fresh = self._spares.pop(usable)[0].result() if usable is not None else None
        if fresh is None:
            self._drop_spares()
            fresh = self._prepared(step, spare=False)
        fresh.spare = False  # taken: the replay waits on it now
        if fresh.step is not None and fresh.step < step:
            fresh.skip(step)
        self._finish()
        self._adopt(fresh)
        if self.afresh:  # a loop's server runs a step it has fetched
            self.fetch()
        self.prefetch(step)
        return False

    def prefetch(self, step: int) -> None:
        """Where each step runs once a process, start up to :data:`SPARES` spare processes, replayed
        to ``step``."""
        # no spare unless a rewind fails
        rewinding = self.hello is not None and self.hello.rewinds and not self.rewinds.refused
        if self.reruns or self._restored is None or self._closing or rewinding:
            return
        while len(self._spares) < SPARES:
            self._spares.append((self._pool.submit(self._prepared, step, spare=True), step))

    def _adopt(self, fresh: Replica) -> None:
        """Take over a fresh replica's process and connection (this one's has ended), where no
        rewind is verified."""
        for name in ("listener", "log", "process", "channel", "hello", "step"):
            setattr(self, name, getattr(fresh, name))
        self.rewinds.step, self.rewinds.refused = None, True

    def _prepared(self, step: int, *, spare: bool) -> Replica:
        """A fresh process of this run, restored and replayed to the start of ``step`` (``spare``:
        ahead of need)."""
        assert self._restored is not None, "restore() first"
        with self._spare_lock:
            if self._closing:
                raise ReplicaFailed(f"replay of {self.label}: closed")
            fresh = type(self)(self.spec, self.label)
            fresh.spare = spare
            self._starting.add(fresh)
        try:
            fresh.connect()
            path, first, environment = self._restored
            fresh.request(
                requests.Restore(run=str(path), step=first, environment=environment or {})
            )
            fresh.step = first
            if step > first:
                fresh.step = fresh.skip(step).step
        except BaseException:
            fresh._finish()
            raise
        finally:
            with self._spare_lock:
                self._starting.discard(fresh)
        return fresh

    def _drop_spares(self) -> None:
        spares, self._spares = self._spares, []
        for spare, _ in spares:
            spare.add_done_callback(_finish_spare)
        with self._spare_lock:
            for starting in self._starting:  # mid-start: nobody will take it
                starting._kill()

    # -- the connection --------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ReplicaFailed(
                f"replay of {self.label} ({self.spec.describe()}) exited with code "
                f"{self.process.returncode}: {self._last_output()}"
            )

    def _last_output(self) -> str:
        return last_line(self.log)

    def connect(self) -> Hello:
        """Wait for the process's Recorder to connect; its hello (pid, rank, model structure)."""
        if self.channel is None or self.hello is None:
            self.channel, hello = self.listener.accept(self._check_alive)
            self.hello = Hello.from_json(hello)
        return self.hello

    def request(self, request: Asks[R], progress: Progress | None = None) -> R:
        """Send a request (:mod:`bisect_repro.serve.requests`); its reply, typed (the class the
        request names, read by :func:`~bisect_repro.serve.replies.decode_reply`)."""
        message, tree = self._exchange(request, progress)
        try:
            return decode_reply(request, message, tree)
        except Refused as error:
            raise ReplicaFailed(f"replay of {self.label}: {error}") from None

    def _exchange(
        self, request: Asks[Any], progress: Progress | None = None
    ) -> tuple[dict[str, Any], Any]:
        """Send a request and wait for what the process answers: a JSON object and its state
        tree."""
        channel = self.channel
        assert channel is not None, "connect() first"
        op = request.op
        message, tree = encode(request)
        _log.debug(
            "replay of %s: %s %s", self.label, op, {k: v for k, v in message.items() if k != "op"}
        )
        steps = request.until - (self.step or 0) if isinstance(request, requests.Skip) else 1
        deadline = Deadline(
            f"replay of {self.label}, {op!r}",
            allowance(self.spec.step_seconds, steps),
            self.spec.step_seconds,
        )
        try:
            # see cores.py
            with (
                contextlib.nullcontext()
                if isinstance(request, requests.Exit)
                else CORES.held(urgent=not self.spare)
            ):
                channel.send(message, tree)
                return channel.receive_reply(*guarded(deadline, self._check_alive, progress))
        except DeadlinePassed as error:
            self.process.kill()
            raise ReplicaFailed(str(error)) from None
        except (ChannelClosed, OSError) as error:
            self.process.wait(timeout=30)
            raise ReplicaFailed(
                f"replay of {self.label} ({self.spec.describe()}) stopped during {op!r} (exit code "
                f"{self.process.returncode}): "
                f"{self._last_output()}"
            ) from error

    def restore(
        self,
        run: Path,
        step: int,
        environment: dict[str, Any] | None = None,
        *,
        rebuilt: bool = False,
        kept_from: int | None = None,
        seeded: tuple[str, ...] = (),
    ) -> None:
        """Load a run's checkpoint and recorded settings; ``rebuilt``: keep the hyperparameters the
        code was built with (another config), not the checkpoint's; ``kept_from``: from that step
        on, a call from entropy leaves its stream as it is; ``seeded``: the global streams the
        launch seeded, left as seeded (:class:`~bisect_repro.serve.requests.Restore`). A
        framework's run restores only its own start (the step its script starts from)."""
        if not self.reruns and self._restored is not None:
            self._to_start_of(step)
            return
        run = Path(run).resolve()  # the process may run in another folder (the recorded one)
        self.request(
            requests.Restore(
                run=str(run),
                step=step,
                environment=environment or {},
                rebuilt=rebuilt,
                kept_from=kept_from,
                seeded=seeded,
            )
        )
        self._restored = (run, step, environment)
        self.step = step

    def skip(
        self, until: int, hashes_at: list[int] | None = None, progress: Progress | None = None
    ) -> SkipResult:
        """Train untraced up to ``until``: what the recorder would have logged, and the state
        hashes at the steps in ``hashes_at``."""
        if not self.reruns and self.step is not None and self.step > until:
            self._to_start_of(until)
            return SkipResult(step=until)
        result = self.request(
            requests.Skip(until=until, hashes_at=tuple(hashes_at or ())), progress
        )
        self.step = result.step
        return result

    def fetch(self, keep: list[int] | None = None) -> Fetched:
        """Take the next batch and keep the step's start (and those of the steps in ``keep``)."""
        return self.request(requests.Fetch(keep=tuple(keep or ())))

    def run(
        self,
        step: int,
        *,
        trace: Trace = "light",
        keep: list[int] | tuple[int, ...] = (),
        ops: str | None = None,
        alerts: bool = False,
        environment: dict[str, Any] | None = None,
        advance: list[str] | tuple[str, ...] = (),
        fixed_entropy: int | None = None,
        kept_entropy: bool = False,
        commit: bool = False,
        streams: dict[str, Any] | None = None,
        compile_bisect: str | None = None,
    ) -> StepResult:
        """Run a kept step again (each option: :class:`~bisect_repro.serve.requests.Run`)."""
        plain = streams is None and not advance and fixed_entropy is None and not kept_entropy
        rewound = self._to_start_of(step, plain=plain, compiles=compile_bisect is not None)
        request = requests.Run(
            step=step,
            trace=trace,
            keep=tuple(sorted(keep)),
            ops=ops,
            alerts=alerts,
            environment=environment,
            advance=tuple(advance),
            fixed_entropy=fixed_entropy,
            kept_entropy=kept_entropy,
            commit=commit,
            compile_bisect=compile_bisect,
            streams=streams,
        )
        try:
            result = self.request(request)
        except ReplicaFailed as error:
            if not rewound:
                raise
            # the loop ended, or went on elsewhere than after the step's first run: fresh processes
            # from here on
            self.rewinds.step, self.rewinds.refused, self.rewinds.stopped, self.step = (
                None,
                True,
                str(error),
                step + 1,
            )
            self._to_start_of(step, plain=plain, compiles=compile_bisect is not None)
            result = self.request(request)
        if commit or not self.reruns:
            self.step = step + 1
        return result

    def rewind(self, step: int) -> bool:
        """Put the process back at the start of ``step``, which it ran last; whether its data draws
        moved a stream."""
        rewound = self.request(requests.Rewind(step=step))
        self.step = step
        return rewound.consumes

    def streams(self, step: int) -> StepStart:
        """The streams a kept step starts from (after its batch was fetched, and before) and its
        data position."""
        # a verified rewind's process tells them as it stands
        if self.rewinds.step != step or self.step != step + 1:
            self._to_start_of(step)
        return self.request(requests.Streams(step=step))

    def data(
        self,
        step: int,
        *,
        pre_streams: dict[str, Any] | None = None,
        epoch_streams: dict[str, Any] | None = None,
    ) -> Fetched:
        """A kept step's batch fetched again from its data position, under other streams."""
        return self.request(
            requests.Data(step=step, pre_streams=pre_streams, epoch_streams=epoch_streams)
        )

    def hashes(self) -> dict[str, str]:
        """The hash of every tensor of the state now."""
        return self.request(requests.Hashes()).hashes

    def compiled(self) -> list[CompileCall]:
        """The ``torch.compile`` calls the replayed code made."""
        return self.request(requests.Compiled()).calls

    def describe(self) -> Description:
        """What ``doctor`` asks of a freshly built process."""
        return self.request(requests.Describe())

    def items_change(self, step: int, stream: str) -> bool | None:
        """Whether the dataset's items at a kept step's indices change with ``stream`` one draw
        further."""
        return self.request(requests.Items(step=step, stream=stream)).changes

    def close(self) -> None:
        """End the process (the rest of its script does not run) and remove its folder; a spare
        still starting is killed."""
        with self._spare_lock:
            self._closing = True
        self._drop_spares()
        self._pool.shutdown(wait=True)
        self._finish()

    def _finish(self) -> None:
        """Ask the process to exit (kill it if it does not within 10 s), then close the
        connections."""
        try:
            if self._connected() and self.process.poll() is None:
                with contextlib.suppress(ReplicaFailed):
                    self.request(requests.Exit())
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        finally:
            self._close_connections()
            self.listener.close()

    def _connected(self) -> bool:
        return self.channel is not None

    def _close_connections(self) -> None:
        if self.channel is not None:
            self.channel.close()

    def _kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _finish_spare(future: Future[Replica]) -> None:
    """Done callback of a spare replica nobody took: end its process (one that failed to start has
    none)."""
    if future.exception() is None:
        future.result()._finish()
