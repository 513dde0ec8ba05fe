"""A replica of a distributed run: all its ranks under torchrun, stepped together, replying for one.

:class:`RankedReplica` is the :class:`~bisect_repro.replay.replica.Replica` of a run recorded on
N ranks (:func:`start_replica` makes one for a :class:`~bisect_repro.replay.launch.LaunchSpec`
with ``world_size`` N, and a plain replica otherwise). It
starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m
bisect_repro.replay.bootstrap``: every rank runs the recorded recipe or script, and its Recorder
connects back with its rank in its hello. Every request goes to every rank at once, since the
ranks run a step's collectives together (DDP's all-reduce in backward, FSDP's all-gathers): each
rank restores its own ``rank{r}/`` checkpoint with its own recorded settings, then skips, fetches
and runs the same steps as the others, in lockstep. The replies of one rank, the focus (the rank
the records point to), are returned; the others' are read and checked for errors. What a request
carries for one run only, a state tree (another run's streams to run the step under, another
data position), goes to the focus rank alone: the other ranks run the step from their own state.

A rank that dies, or answers with an error, ends the replay with one :class:`ReplicaFailed` line
that quotes the failed rank's last output (each rank writes its own log); every rank that
connected is then killed and the launcher stopped, so that no rank is left waiting in a
collective.

Where the guarantees stop: one node (``--standalone``) and only the recorded world size; only the
focus rank's replies are compared (with its records and with the other run's focus rank), so
what an experiment does on another rank is not compared: it reaches the focus only through the
collectives. The ranks rendezvous on the ports torchrun picks, not the recorded ones.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

from ..record.torchrun import torchrun_command
from ..serve.channel import Channel, ChannelClosed, Listener
from ..serve.protocol import Hello
from ..serve.requests import Asks, Restore, encode
from ..store.run import Run
from .bootstrap import LOGS_VARIABLE
from .launch import LaunchSpec
from .output import last_line
from .replica import Progress, Replica, ReplicaFailed

__all__ = ["RankedReplica", "start_replica"]

_log = logging.getLogger(__name__)

# what torch puts before a rank's uncaught error
_PREFIX = re.compile(r"^\[(default)?rank\d+\]:\s*")
# torchrun's summary of the first failure
_ROOT_CAUSE = re.compile(r"^\s*rank\s*:\s*(\d+)", re.MULTILINE)


class RankedReplica(Replica):
    """The ranks of one distributed run (see the module docstring)."""

    process: subprocess.Popen[bytes]  # torchrun, started afresh: never forked

    def _start(self) -> None:
        self.channels: dict[int, Channel] = {}
        self.hellos: dict[int, Hello] = {}
        self._broken: str | None = None
        self._lock = threading.Lock()
        self.listener = Listener()
        # the launcher's; each rank writes rank{r}.log beside it
        self.log = Path(self.listener.folder) / "output.log"
        world = self.world_size
        self._receivers = ThreadPoolExecutor(world)
        environment = {**self._environment(), LOGS_VARIABLE: str(self.listener.folder)}
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(
                [*torchrun_command(world), "-m", "bisect_repro.replay.bootstrap"],
                cwd=self.listener.folder,  # private, as a single replica's (see Replica._start)
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _log.info(
            "replay of %s: started torchrun with %d ranks, pid %d, output in %s",
            self.label,
            world,
            self.process.pid,
            self.log.parent,
        )

    @property
    def world_size(self) -> int:
        assert self.spec.world_size is not None
        return self.spec.world_size

    # -- failures ------------------------------------------------------------------------------
    def _output(self, rank: int | None) -> str:
        return last_line(
            self.log if rank is None else self.log.with_name(f"rank{rank}.log"),
            lambda line: _PREFIX.sub("", line),
        )

    def _failed_rank(self, noticed: int | None) -> int | None:
        """The rank that failed first: the one whose connection closed first (``noticed``: a rank
        that another's death stops in a collective dies later), else the one torchrun names as the
        root cause, else the first whose log shows an error."""
        if noticed is not None:
            return noticed
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace")
            named = (
                _ROOT_CAUSE.search(text, text.find("Root Cause") + 1)
                if "Root Cause" in text
                else None
            )
            if named is not None:
                return int(named.group(1))
        for rank in range(self.world_size):
            with contextlib.suppress(OSError):
                text = self.log.with_name(f"rank{rank}.log").read_text(errors="replace")
                if "Traceback" in text or re.search(r"^(error|bisect-repro): ", text, re.MULTILINE):
                    return rank
        return None

    def _last_output(self) -> str:
        return self._output(self._failed_rank(None))

    def _fail(self, what: str, rank: int | None = None, detail: str | None = None) -> NoReturn:
        """End the replay: every rank and the launcher stopped, one line that names the rank."""
        with self._lock:
            if self._broken is None:
                failed = self._failed_rank(rank)
                who = f"rank {failed}" if failed is not None else "torchrun"
                self._broken = (
                    f"replay of {self.label} ({self.spec.describe()}): {who} {what}: "
                    f"{detail or self._output(failed)}"
                )
                self._kill()
        raise ReplicaFailed(self._broken)

    def _kill(self) -> None:
        """Kill every rank that connected, then the launcher (asked first: it stops the ranks it
        started)."""
        for hello in self.hellos.values():
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError, TypeError):
                if hello.pid > 0:
                    os.kill(hello.pid, signal.SIGKILL)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def _check_alive(self) -> None:
        if self._broken is not None:
            raise ReplicaFailed(self._broken)
        if self.process.poll() is not None:
            self._fail(f"exited (torchrun's exit code {self.process.returncode})")

    # -- the connections -----------------------------------------------------------------------
    def connect(self) -> Hello:
        """Wait for every rank's Recorder to connect; the focus rank's hello."""
        world = self.world_size
        while len(self.channels) < world:
            channel, message = self.listener.accept(self._check_alive)
            hello = Hello.from_json(message)
            rank, size = hello.rank, hello.world_size
            if (
                type(rank) is not int
                or rank in self.channels
                or not 0 <= rank < world
                or size != world
            ):
                channel.close()
                self._fail(f"connected as rank {rank} of {size}, where {world} ranks were started")
            self.channels[rank], self.hellos[rank] = channel, hello
        self.channel, self.hello = self.channels[self.spec.focus], self.hellos[self.spec.focus]
        return self.hello

    def _exchange(
        self, request: Asks[Any], progress: Progress | None = None
    ) -> tuple[dict[str, Any], Any]:
        """Send a request to every rank (its state tree to the focus rank only); the focus rank's
        answer."""
        return self._broadcast(dict.fromkeys(range(self.world_size), request), progress)

    def _broadcast(
        self, requests: Mapping[int, Asks[Any]], progress: Progress | None = None
    ) -> tuple[dict[str, Any], Any]:
        """Send each rank its request (a state tree to the focus rank only); the focus rank's
        reply."""
        assert len(self.channels) == self.world_size, "connect() first"
        focus = self.spec.focus
        op = requests[focus].op
        _log.debug("replay of %s: %s to %d ranks", self.label, op, self.world_size)
        self._check_alive()
        for rank, channel in self.channels.items():
            message, tree = encode(requests[rank])
            try:
                channel.send(message, tree if rank == focus else None)
            except OSError:
                self._fail(f"stopped before {op!r}", rank)
        futures = {
            rank: self._receivers.submit(self._reply, rank, op, progress if rank == focus else None)
            for rank in self.channels
        }
        replies = {}
        for rank, future in futures.items():
            with contextlib.suppress(ReplicaFailed):  # the first failure is kept in _broken
                replies[rank] = future.result()
        if self._broken is not None:
            raise ReplicaFailed(self._broken)
        return replies[focus]

    def _reply(self, rank: int, op: str, progress: Progress | None) -> tuple[dict[str, Any], Any]:
        channel = self.channels[rank]
        try:
            reply, payload = channel.receive_reply(self._check_alive, progress)
        except (ChannelClosed, OSError):
            self._fail(f"stopped during {op!r}", rank)
        if "error" in reply:
            self._fail(f"could not {op}", rank, str(reply["error"]))
        return reply, payload

    # -- requests that differ by rank ----------------------------------------------------------
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
        """Each rank loads its own checkpoint at ``step`` and applies its own recorded settings
        (``rank{r}/rank.json``'s; ``environment`` only where a rank has none recorded)."""
        if not self.reruns and self._restored is not None:
            super().restore(
                run, step, environment, rebuilt=rebuilt, kept_from=kept_from, seeded=seeded
            )
            return
        run = Path(run).resolve()
        opened = Run.open(run)
        own = {
            r: opened.open_rank(r).environment or environment or {} for r in range(self.world_size)
        }
        self._broadcast(
            {
                r: Restore(
                    run=str(run),
                    step=step,
                    environment=own[r],
                    rebuilt=rebuilt,
                    kept_from=kept_from,
                    seeded=seeded,
                )
                for r in own
            }
        )
        self._restored = (run, step, environment)
        self.step = step

    # -- the end -------------------------------------------------------------------------------
    def _adopt(self, fresh: Replica) -> None:
        assert isinstance(fresh, RankedReplica)
        super()._adopt(fresh)
        self.channels, self.hellos, self._broken, self._receivers = (
            fresh.channels,
            fresh.hellos,
            fresh._broken,
            fresh._receivers,
        )

    def _connected(self) -> bool:
        return len(self.channels) == self.world_size and self._broken is None

    def _close_connections(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self._receivers.shutdown(wait=False)


def start_replica(spec: LaunchSpec, label: str) -> Replica:
    """The replica of a run: all its ranks under torchrun when it was distributed (``world_size``),
    else one process."""
    return RankedReplica(spec, label) if spec.world_size is not None else Replica(spec, label)
