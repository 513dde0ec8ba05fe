"""What the replay and the experiments ask of a replica: :class:`ReplicaLike`, and what starts one.

:class:`ReplicaLike` is the interface :mod:`~bisect_repro.replay.lockstep` and ``diagnose/`` are
typed against: a run's code steered step by step, each request answered with a typed reply
(:mod:`bisect_repro.serve.protocol`). :class:`~bisect_repro.replay.replica.Replica` (a process of
its own) and :class:`~bisect_repro.replay.ranked.RankedReplica` (all of a distributed run's ranks)
implement it, and so does the test suite's replica without a process (``tests/fake_replica.py``),
which mypy checks against it. A :data:`ReplicaFactory` starts one for a
:class:`~bisect_repro.replay.launch.LaunchSpec` and a label (the real one:
:func:`~bisect_repro.replay.ranked.start_replica`); the experiments that start replicas of their own
take one, so that they run against a fake as they do against processes.

Where the guarantees stop: the Protocol fixes the names and types of the requests, not their
meaning; that is stated on :class:`~bisect_repro.replay.replica.Replica`'s methods, and the fake's
module docstring says which of it the fake simulates.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..capture.compiled import CompileCall
from ..serve.protocol import Description, Fetched, Hello, SkipResult, StepResult, StepStart
from ..serve.requests import Trace
from .launch import LaunchSpec
from .rewind import Rewinds

__all__ = ["Progress", "ReplicaFactory", "ReplicaLike"]

Progress = Callable[[int], None]
"""Called with each step trained, while a replica trains untraced (:meth:`ReplicaLike.skip`)."""


class ReplicaLike(Protocol):
    """A run's code, steered from here (each method:
    :class:`~bisect_repro.replay.replica.Replica`'s)."""

    hello: Hello | None
    """What the code said when it connected (``None`` before :meth:`connect`)."""
    step: int | None
    """The step the code stands at the start of (``None`` before a restore)."""
    afresh: bool
    """Each repeat of a step runs in a fresh process (:meth:`repeat_afresh`)."""
    rewinds: Rewinds
    """Which step a repeat rewinds this replica's one process to (an unchanged script's;
    :mod:`~bisect_repro.replay.rewind`)."""

    @property
    def reruns(self) -> bool:
        """Whether a step can run again in the same process."""
        ...

    def connect(self) -> Hello: ...

    def restore(
        self,
        run: Path,
        step: int,
        environment: dict[str, Any] | None = None,
        *,
        rebuilt: bool = False,
        kept_from: int | None = None,
        seeded: tuple[str, ...] = (),
    ) -> None: ...

    def skip(
        self, until: int, hashes_at: list[int] | None = None, progress: Progress | None = None
    ) -> SkipResult: ...

    def fetch(self, keep: list[int] | None = None) -> Fetched: ...

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
    ) -> StepResult: ...

    def rewind(self, step: int) -> bool: ...

    def streams(self, step: int) -> StepStart: ...

    def data(
        self,
        step: int,
        *,
        pre_streams: dict[str, Any] | None = None,
        epoch_streams: dict[str, Any] | None = None,
    ) -> Fetched: ...

    def hashes(self) -> dict[str, str]: ...

    def compiled(self) -> list[CompileCall]: ...

    def describe(self) -> Description: ...

    def items_change(self, step: int, stream: str) -> bool | None: ...

    def prefetch(self, step: int) -> None: ...

    def repeat_afresh(self, first: int) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ReplicaLike: ...

    def __exit__(self, *exc: object) -> None: ...


ReplicaFactory = Callable[[LaunchSpec, str], ReplicaLike]
"""Starts a replica of a spec, with a label for its messages
(:func:`~bisect_repro.replay.ranked.start_replica`)."""
