"""A replica: one run replaying in its own process, steered from here.

:class:`Replica` starts ``python -m bisect_repro.record.bootstrap`` for a
:class:`~bisect_repro.replay.launch.LaunchSpec` (the recorded script or recipe, with the recorded
environment variables), waits for its Recorder to connect back, and turns requests (see
:mod:`bisect_repro.record.serve`) into typed results: :class:`StepResult` for a step run again,
:class:`SkipResult` for steps trained untraced. Each replica is its own process, so two runs never
share a random stream, a setting or a module global, and environment variables read at start-up
(``OMP_NUM_THREADS``, ``CUBLAS_WORKSPACE_CONFIG``, ``PYTHONHASHSEED``) are the recorded ones (those
:data:`~bisect_repro.replay.launch.REPLAYED_VARIABLES` allows, and no other). The process starts in
the listener's private folder, never in the recorded working directory, so that nothing there is
imported; the bootstrap moves to that directory once the import path is fixed.

A distributed run's replica is a :class:`~bisect_repro.replay.ranks.RankedReplica` (a
:class:`LaunchSpec` with a ``world_size`` makes one): all its ranks under ``torchrun``, stepped
together, replying for one rank.

Where the guarantees stop: the replica's output (the script's prints) goes to a log file, whose
last lines are quoted when the process dies; a replica that never connects (the script fails, or
never builds a Recorder) is reported the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..capture.trace import OpRecord, TraceEntry
from ..errors import BisectReproError
from ..record.bootstrap import SPEC_VARIABLE
from ..record.channel import Channel, ChannelClosed, Listener
from .launch import LaunchSpec

__all__ = ["Replica", "ReplicaFailed", "SkipResult", "StepResult"]

Progress = Callable[[int], None]


class ReplicaFailed(BisectReproError):
    """The replaying process died or could not start; the message quotes its last output."""


@dataclass
class StepResult:
    """A step run again in a replica."""

    step: int
    entries: list[TraceEntry] = field(default_factory=list)
    """Every traced tensor in execution order (empty when the step ran untraced)."""
    kept: dict[int, torch.Tensor] = field(default_factory=dict)
    """Copies of the entries asked for, by index."""
    ops: list[OpRecord] | None = None
    """Every aten op of the traced pass, when asked for."""
    alerts: list[dict[str, Any]] = field(default_factory=list)
    """Ops PyTorch reported as having no deterministic kernel (under ``alerts``)."""
    loss: float | None = None
    outcome: str = ""
    """One digest of the whole state and the gradients after the step."""
    streams_after: dict[str, str] = field(default_factory=dict)
    """The digest of each random stream after the step."""
    seeding: list[dict[str, Any]] = field(default_factory=list)
    """The seeding calls the step made (see :class:`~bisect_repro.capture.seeding.SeedingCall`)."""
    batch: str | None = None
    """The batch's digest, when the replica learns it only as the step runs (a framework's loop)."""

    @classmethod
    def from_reply(cls, reply: dict[str, Any], tree: Any) -> StepResult:
        ops = reply.get("ops")
        return cls(
            step=int(reply["step"]),
            entries=[TraceEntry(*entry) for entry in reply.get("entries", [])],
            kept={int(k): v for k, v in ((tree or {}).get("kept") or {}).items()},
            ops=[OpRecord(op, layer, tuple(i), tuple(o), arguments, phase) for op, layer, phase, i, o, arguments in ops]
            if ops is not None
            else None,
            alerts=list(reply.get("alerts", [])),
            loss=reply.get("loss"),
            outcome=reply.get("outcome", ""),
            streams_after=dict(reply.get("streams_after", {})),
            seeding=list(reply.get("seeding", [])),
            batch=reply.get("batch"),
        )


@dataclass
class SkipResult:
    """Steps trained untraced: what the recorder would have logged, and state hashes where asked."""

    step: int
    records: list[dict[str, Any]]
    hashes: dict[int, dict[str, str]]


class Replica:
    """One replaying process (see the module docstring). Start several, then :meth:`connect` each."""

    def __init__(self, spec: LaunchSpec, label: str) -> None:
        self.spec, self.label = spec, label
        self.channel: Channel | None = None
        self.hello: dict[str, Any] = {}
        self.step: int | None = None
        self._restored: tuple[Path, int, dict[str, Any] | None] | None = None
        self._pool = ThreadPoolExecutor(1)
        self._spare: Future[Replica] | None = None
        self._spare_step: int | None = None
        self._start()

    def __new__(cls, spec: LaunchSpec, label: str) -> Replica:
        if cls is Replica and spec.world_size is not None:  # a distributed run: its ranks under torchrun
            from .ranks import RankedReplica

            return super().__new__(RankedReplica)
        return super().__new__(cls)

    def _environment(self) -> dict[str, str]:
        """The environment the process starts with: this one's, with the run's recorded variables
        and the channel's."""
        package_root = str(Path(__file__).resolve().parents[2])
        environment = {k: v for k, v in os.environ.items() if not k.startswith("BISECT_REPRO_")}
        for name, value in self.spec.variables.items():  # REPLAYED_VARIABLES only (see launch.py)
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = str(value)
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, environment.get("PYTHONPATH")) if p)
        environment.update(self.listener.environment())
        environment[SPEC_VARIABLE] = json.dumps(self.spec.to_json())
        return environment

    def _start(self) -> None:
        self.listener = Listener()
        self.log = Path(self.listener.folder) / "output.log"
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bisect_repro.record.bootstrap"],
                cwd=self.listener.folder,  # private: the recorded cwd never enters sys.path; the bootstrap moves there
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )

    @property
    def reruns(self) -> bool:
        """Whether a step can run again in this process (``False`` when a framework drives the loop:
        then each repeat of a step is a fresh process, replayed to it, which this class starts)."""
        return bool(self.hello.get("reruns", True))

    def _to_start_of(self, step: int) -> None:
        """In a process that runs each step once (a framework's), stand at the start of ``step``:
        go on from here, or take a fresh process replayed to it. The next fresh process is started
        at once, in the background, for the same step: experiments repeat a step several times."""
        if self.reruns or self.step == step:
            return
        if self.step is not None and self.step < step:
            self.skip(step)
            return
        fresh = self._spare.result() if self._spare is not None and self._spare_step == step else None
        if fresh is None:
            self._drop_spare()
            fresh = self._prepared(step)
        self._finish()
        self._adopt(fresh)
        self._spare, self._spare_step = self._pool.submit(self._prepared, step), step

    def _adopt(self, fresh: Replica) -> None:
        """Take over a fresh replica's process and connection (this one's has ended)."""
        self.listener, self.log, self.process, self.channel, self.hello, self.step = (
            fresh.listener,
            fresh.log,
            fresh.process,
            fresh.channel,
            fresh.hello,
            fresh.step,
        )

    def _prepared(self, step: int) -> Replica:
        """A fresh process of this run, restored and replayed to the start of ``step``."""
        assert self._restored is not None, "restore() first"
        fresh = Replica(self.spec, self.label)
        fresh.connect()
        path, first, environment = self._restored
        fresh.request("restore", run=str(path), step=first, environment=environment or {}, rebuilt=False)
        fresh.step = first
        if step > first:
            reply, _ = fresh.request("skip", until=step, hashes_at=[])
            fresh.step = int(reply["step"])
        return fresh

    def _drop_spare(self) -> None:
        if self._spare is not None:
            spare, self._spare = self._spare, None
            spare.add_done_callback(_finish_spare)

    # -- the connection --------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ReplicaFailed(
                f"replay of {self.label} ({self.spec.describe()}) exited with code {self.process.returncode}: {self._last_output()}"
            )

    def _last_output(self) -> str:
        try:
            lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            lines = []
        return lines[-1][:300] if lines else "no output"

    def connect(self) -> dict[str, Any]:
        """Wait for the process's Recorder to connect; its hello (pid, rank, model structure)."""
        if self.channel is None:
            self.channel, self.hello = self.listener.accept(self._check_alive)
        return self.hello

    def request(self, op: str, tree: Any = None, progress: Progress | None = None, **args: Any) -> tuple[dict[str, Any], Any]:
        channel = self.channel
        assert channel is not None, "connect() first"
        try:
            channel.send({"op": op, **args}, tree)
            reply, payload = channel.receive_reply(self._check_alive, progress)
        except (ChannelClosed, OSError) as error:
            self.process.wait(timeout=30)
            raise ReplicaFailed(
                f"replay of {self.label} ({self.spec.describe()}) stopped during {op!r} (exit code {self.process.returncode}): "
                f"{self._last_output()}"
            ) from error
        if "error" in reply:
            raise ReplicaFailed(f"replay of {self.label}: {reply['error']}")
        return reply, payload

    # -- requests ------------------------------------------------------------------------------
    def restore(self, run: Path, step: int, environment: dict[str, Any] | None = None, *, rebuilt: bool = False) -> None:
        """Load a run's checkpoint and recorded settings; ``rebuilt``: keep the hyperparameters the
        code was built with (another config), not the checkpoint's. A framework's run restores only
        its own start (the step its script starts from)."""
        if not self.reruns and self._restored is not None:
            self._to_start_of(step)
            return
        run = Path(run).resolve()  # the process may run in another folder (the recorded one)
        self.request("restore", run=str(run), step=step, environment=environment or {}, rebuilt=rebuilt)
        self._restored = (run, step, environment)
        self.step = step

    def skip(self, until: int, hashes_at: list[int] | None = None, progress: Progress | None = None) -> SkipResult:
        if not self.reruns and self.step is not None and self.step > until:
            self._to_start_of(until)
            return SkipResult(until, [], {})
        reply, _ = self.request("skip", until=until, hashes_at=list(hashes_at or []), progress=progress)
        self.step = int(reply["step"])
        return SkipResult(self.step, reply["records"], {int(k): v for k, v in reply["hashes"].items()})

    def fetch(self, keep: list[int] | None = None) -> dict[str, Any]:
        reply, _ = self.request("fetch", keep=list(keep or []))
        return reply

    def run(self, step: int, *, streams: dict[str, Any] | None = None, **options: Any) -> StepResult:
        """Run a kept step again (options: ``trace``, ``keep``, ``ops``, ``alerts``, ``environment``,
        ``advance``, ``fixed_entropy``, ``commit``; see :mod:`bisect_repro.record.serve`)."""
        self._to_start_of(step)
        options = {k: (sorted(v) if isinstance(v, set) else v) for k, v in options.items()}
        reply, tree = self.request("run", {"streams": streams} if streams is not None else None, step=step, **options)
        if options.get("commit") or not self.reruns:
            self.step = step + 1
        return StepResult.from_reply(reply, tree)

    def streams(self, step: int) -> dict[str, Any]:
        """The streams a kept step starts from: ``streams`` (after its batch was fetched),
        ``pre_streams`` (before) and its ``data`` position."""
        self._to_start_of(step)
        _, tree = self.request("streams", step=step)
        return tree

    def data(self, step: int, *, pre_streams: dict[str, Any] | None = None, epoch_streams: dict[str, Any] | None = None) -> dict[str, Any]:
        reply, _ = self.request("data", {"pre_streams": pre_streams, "epoch_streams": epoch_streams}, step=step)
        return reply

    def hashes(self) -> dict[str, str]:
        return self.request("hashes")[0]["hashes"]

    def describe(self) -> dict[str, Any]:
        return self.request("describe")[0]

    def items_change(self, step: int, stream: str) -> bool | None:
        return self.request("items", step=step, stream=stream)[0]["changes"]

    def close(self) -> None:
        """End the process (the rest of its script does not run) and remove its folder."""
        self._drop_spare()
        self._pool.shutdown(wait=True)
        self._finish()

    def _finish(self) -> None:
        try:
            if self.channel is not None and self.process.poll() is None:
                with contextlib.suppress(ReplicaFailed):
                    self.request("exit")
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        finally:
            if self.channel is not None:
                self.channel.close()
            self.listener.close()

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _finish_spare(future: Future[Replica]) -> None:
    """Done callback of a spare replica nobody took: end its process (one that failed to start has none)."""
    if future.exception() is None:
        future.result()._finish()
