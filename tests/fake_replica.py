"""A replica without a process: a small deterministic simulation of a run's code, steered like a
real one.

:class:`FakeReplica` has the interface of :class:`~bisect_repro.replay.replica.Replica` and the
semantics the experiments rely on, those of :class:`~bisect_repro.serve.server.StepServer` (and,
with ``Program(reruns=False)``, of a framework's :class:`~bisect_repro.serve.hooks.HookServer`):

- ``fetch`` takes the next batch (the loader draws from the streams) and keeps the step's start:
  the state, the streams after the fetch and before it, the data position; ``keep`` says which
  other kept starts survive;
- ``run`` runs a kept step again from its start, under ``streams`` instead of its own when given,
  with each stream in ``advance`` drawn once first, under the in-process ``environment`` for that
  step only; ``commit`` (from the latest kept step) moves on to the next step; the trainee is left
  in the state the step ended in;
- ``skip`` trains untraced up to a step, with what the recorder would have logged and the hashes;
- a framework's process runs each step once, in order: a step run again is a fresh process,
  restored and replayed to it (the real :class:`Replica` does this for such a process), and a
  batch cannot be fetched again; after ``repeat_afresh(first)`` any program's steps run that way,
  each fresh process restored at checkpoint ``first``;
- ``compiled`` lists no ``torch.compile`` call, and ``restore``'s ``kept_from`` is not simulated
  (a program's calls from entropy are its own).

It implements :class:`~bisect_repro.replay.interface.ReplicaLike`, and mypy checks that it does
(``tests/fake_replica.py`` is in mypy's files).

What a step computes is the test's :class:`Program`: its ``step`` function gets a :class:`Call`
(the step, its batch, its state, the streams and settings it runs under, how often it and any step
already ran in this process, the entropy a seed from the OS would get) and returns an
:class:`Outcome` (its trace past the batch, its ops, its loss, the streams after it, its seeding
calls). :mod:`tests.fake_programs` has such functions, and writes what a program computes as a run
directory.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from bisect_repro.capture import env
from bisect_repro.capture.compiled import CompileCall
from bisect_repro.capture.rng import tree_digest
from bisect_repro.capture.trace import OpRecord, TraceEntry
from bisect_repro.replay.interface import ReplicaFactory, ReplicaLike
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.replica import ReplicaFailed
from bisect_repro.replay.rewind import Rewinds
from bisect_repro.serve.protocol import (
    Description,
    Fetched,
    Hello,
    SkipResult,
    StepRecord,
    StepResult,
    StepStart,
)
from bisect_repro.serve.requests import Trace
from bisect_repro.store.run import Run

_ENTROPY = itertools.count(1_000)  # what the OS hands a seed from entropy: never the same twice


def digest(*parts: Any) -> str:
    """A content digest of anything printable (a stand-in for a tensor's hash)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


# -- what the test writes --------------------------------------------------------------------------
@dataclass(frozen=True)
class Batch:
    """What a loader gives for one step."""

    indices: list[int] | None
    content: str
    streams: Mapping[str, Any]
    """The streams after the loader drew from them."""


def sequential(position: int, streams: Mapping[str, Any]) -> Batch:
    """A loader that takes sample ``position`` and draws nothing."""
    return Batch([position], digest("sample", position), streams)


@dataclass(frozen=True)
class Call:
    """One run of a step, as the step's code sees it."""

    step: int
    batch: str
    state: Mapping[str, str]
    """The trainee's tensors (their hashes) at the step's start."""
    streams: Mapping[str, Any]
    """The streams the step starts from (a stream's state is a number: a draw adds one)."""
    environment: Mapping[str, Any]
    """The in-process settings it runs under."""
    spec: LaunchSpec | None
    """What the process was started from (its ``config``, its ``variables``)."""
    runs: int
    """How many times this step already ran in this process."""
    calls: int
    """How many steps this process ran before this one (a counter in a closure)."""
    entropy: int
    """The seed a call from entropy gets in this run."""
    fixed_entropy: int | None
    """The seed every call from entropy gets instead, when the controller fixes it."""


@dataclass
class Outcome:
    """What one run of a step did."""

    entries: list[TraceEntry]
    """The full trace after the batch: forward, backward, then the state after the step
    (``optimizer``)."""
    streams: Mapping[str, Any]
    """The streams after the step."""
    loss: float | None = None
    ops: list[OpRecord] = field(default_factory=list)
    seeding: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Program:
    """The code of one run, as a fake replica runs it."""

    step: Callable[[Call], Outcome]
    state: dict[str, str] = field(default_factory=lambda: {"fc.weight": "w0"})
    """The trainee's tensors (their hashes) as built."""
    build: Callable[[LaunchSpec | None], Mapping[str, str]] | None = None
    """The trainee's tensors as built from what the process was started from (its ``seeds``, its
    ``config``), instead of ``state``."""
    streams: dict[str, Any] = field(default_factory=lambda: {"torch": 0})
    loader: Callable[[int, Mapping[str, Any]], Batch] = sequential
    environment: dict[str, Any] = field(default_factory=dict)
    """The process's settings as built (its fingerprint)."""
    reruns: bool = True
    """``False``: a framework drives the loop (each step runs once per process)."""


# -- the fake --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Start:
    """A kept step's start."""

    step: int
    state: dict[str, str]
    streams: dict[str, Any]
    pre_streams: dict[str, Any]
    data: dict[str, Any]
    batch: Batch


def _tensor(digest_: str) -> torch.Tensor:
    """A small tensor that stands for the one a trace entry hashed (equal digests, equal
    tensors)."""
    return torch.tensor(
        list(hashlib.blake2b(digest_.encode(), digest_size=4).digest()), dtype=torch.float32
    )


class FakeReplica:
    """A replica of a :class:`Program` (see the module docstring)."""

    def __init__(
        self, program: Program, label: str = "run A", spec: LaunchSpec | None = None
    ) -> None:
        self.program, self.label, self.spec = program, label, spec
        self.hello: Hello | None = None
        self.afresh = False
        """Each repeat of a step runs in a fresh process (:meth:`repeat_afresh`)."""
        self.rewinds = Rewinds(refused=True)
        """A fake's process is never rewound: its repeats run again in place, or afresh."""
        self.step: int | None = None
        self.closed = False
        self.processes = 0
        """How many processes this replica has had (a framework's takes a fresh one to repeat a
        step)."""
        self._restored: tuple[Path, int, dict[str, Any]] | None = None
        self.seeded: tuple[str, ...] = ()
        self.prefetched: list[int] = []
        """The steps a spare process was asked for (:meth:`prefetch`)."""
        self._build()

    def _build(self) -> None:
        """A freshly built process: the program's state and streams, nothing run yet."""
        self.processes += 1
        built = self.program.state if self.program.build is None else self.program.build(self.spec)
        self.state, self.rng = dict(built), dict(self.program.streams)
        """The trainee's tensors (their hashes) and the random streams, now."""
        self.cursor: dict[str, Any] = {"position": 0}
        """The data position now."""
        self.position = 0
        self.settings = dict(self.program.environment)
        self.kept: dict[int, _Start] = {}
        self.runs: Counter[int] = Counter()
        self.calls = 0

    @property
    def reruns(self) -> bool:
        return (self.hello is None or self.hello.reruns) and not self.afresh

    def repeat_afresh(self, first: int) -> None:
        """From now on each repeat of a step is a fresh process restored at checkpoint ``first`` and
        replayed to it."""
        assert self._restored is not None, "restore() first"
        path, _, environment = self._restored
        self._restored, self.afresh = (path, first, environment), True

    def _check(self) -> None:
        assert self.hello is not None, "connect() first"
        assert not self.closed, "the replica is closed"

    def _to_start_of(self, step: int) -> None:
        """A framework's process: go on to ``step``, or take a fresh process replayed to it."""
        if self.reruns or self.step == step:
            return
        if self.step is None or self.step > step:
            assert self._restored is not None, "restore() first"
            self._build()
            self._load(*self._restored)
        self.skip(step)

    def prefetch(self, step: int) -> None:
        """A framework's process: a real replica starts a spare process trained to ``step`` here;
        noted in ``prefetched`` (the fake builds its fresh process when a step is repeated)."""
        if not self.reruns:
            self.prefetched.append(step)

    # -- requests ----------------------------------------------------------------------------------
    def connect(self) -> Hello:
        self.hello = Hello(pid=0, reruns=self.program.reruns)
        return self.hello

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
        """Load the run directory's checkpoint (a framework's process keeps the state it was built
        with)."""
        self._check()
        self.seeded = seeded
        if not self.reruns and self._restored is not None:
            self._to_start_of(step)
            return
        self._restored = (Path(run), step, dict(environment or {}))
        self._load(*self._restored)

    def _load(self, run: Path, step: int, environment: dict[str, Any]) -> None:
        self.settings.update({k: v for k, v in environment.items() if k in env.APPLICABLE})
        if self.program.reruns:  # a framework's process builds its own start
            checkpoint = Run.open(run).checkpoint(step)
            self.state, self.rng, self.cursor = (
                dict(checkpoint["hashes"]),
                dict(checkpoint["streams"]),
                dict(checkpoint["data"]),
            )
        elif step != 0:
            raise ReplicaFailed(
                f"replay of {self.label}: a framework's run replays from its own start (step 0), "
                f"not from step {step}"
            )
        self.position = self.step = step
        self.kept.clear()

    def skip(
        self,
        until: int,
        hashes_at: list[int] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> SkipResult:
        """Train untraced up to ``until``: what the recorder would have logged, the hashes at
        ``hashes_at``."""
        self._check()
        if not self.reruns and self.step is not None and self.step > until:
            self._to_start_of(until)
            return SkipResult(step=until)
        result = SkipResult(step=self.position)
        while self.position < until:
            if self.position in (hashes_at or ()):
                result.hashes[self.position] = dict(self.state)
            start, outcome = self._advance()
            result.records.append(
                StepRecord(
                    step=start.step,
                    order=self._order(start.batch),
                    batch=start.batch.content,
                    loss=outcome.loss,
                )
            )
        if self.position in (hashes_at or ()):
            result.hashes[self.position] = dict(self.state)
        self.kept.clear()
        result.step = self.step = self.position
        return result

    def _advance(self) -> tuple[_Start, Outcome]:
        """Train the next step untraced, as ``skip`` (and the recording) does."""
        start = self._take()
        outcome = self._execute(start, dict(start.streams), dict(self.settings), fixed_entropy=None)
        self.position += 1
        return start, outcome

    def _order(self, batch: Batch) -> str | None:
        """The digest of a batch's sample indices, as logged (none in a framework's loop)."""
        return digest(batch.indices) if batch.indices is not None and self.program.reruns else None

    def _take(self) -> _Start:
        """The next batch from the loader, and the start of the step it is for."""
        pre_streams, data = dict(self.rng), dict(self.cursor)
        batch = self.program.loader(self.cursor["position"], pre_streams)
        self.rng = dict(batch.streams)
        self.cursor = {**self.cursor, "position": self.cursor["position"] + 1}
        return _Start(self.position, dict(self.state), dict(self.rng), pre_streams, data, batch)

    def _fetched(self, start: _Start, batch: Batch) -> Fetched:
        if not self.program.reruns:  # a framework's loop tells the batch only as the step runs
            return Fetched(step=start.step)
        return Fetched(
            step=start.step, indices=batch.indices, order=self._order(batch), batch=batch.content
        )

    def fetch(self, keep: list[int] | None = None) -> Fetched:
        """Take the next batch and keep the step's start (and forget those not in ``keep``)."""
        self._check()
        self.kept = {s: start for s, start in self.kept.items() if s in (keep or ())}
        start = self.kept[self.position] = self._take()
        return self._fetched(start, start.batch)

    def _kept(self, step: int) -> _Start:
        self._to_start_of(step)
        # the framework hands the step its batch as it reaches it
        if not self.reruns and step not in self.kept:
            self.kept[step] = self._take()
        if step not in self.kept:
            raise ReplicaFailed(
                f"replay of {self.label}: step {step} is not kept (kept: {sorted(self.kept)})"
            )
        return self.kept[step]

    def _execute(
        self,
        start: _Start,
        streams: dict[str, Any],
        settings: dict[str, Any],
        fixed_entropy: int | None,
    ) -> Outcome:
        """Run the step's code from ``start`` under ``streams`` and ``settings``; the trainee is
        left as it ends."""
        call = Call(
            step=start.step,
            batch=start.batch.content,
            state=dict(start.state),
            streams=streams,
            environment=settings,
            spec=self.spec,
            runs=self.runs[start.step],
            calls=self.calls,
            entropy=next(_ENTROPY),
            fixed_entropy=fixed_entropy,
        )
        outcome = self.program.step(call)
        self.runs[start.step] += 1
        self.calls += 1
        self.state = {e.tensor: e.digest for e in outcome.entries if e.phase == "optimizer"}
        self.rng = dict(outcome.streams)
        return outcome

    def rewind(self, step: int) -> bool:
        """A fake's process never rewinds (its :attr:`rewinds` are refused)."""
        raise ReplicaFailed(f"replay of {self.label}: step {step} cannot be rewound here")

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
        """Run a kept step again from its start (see the module docstring); ``alerts`` are never
        raised here, and nothing is compiled to bisect."""
        self._check()
        start = self._kept(step)
        committed = (commit and step == max(self.kept)) or not self.reruns
        streams = dict(start.streams if streams is None else streams)
        for name in advance:
            streams[name] += 1
        settings = {
            **self.settings,
            **{k: v for k, v in (environment or {}).items() if k in env.APPLICABLE},
        }
        outcome = self._execute(start, streams, settings, fixed_entropy)
        batch = start.batch
        order = self._order(batch)
        data = [TraceEntry("data", None, "batch.indices", order)] if order is not None else []
        entries = [*data, TraceEntry("data", None, "batch.0", batch.content), *outcome.entries]
        if trace == "light":
            entries = [e for e in entries if e.phase in ("data", "optimizer")]
        elif trace == "none":
            entries = []
        if committed:
            self.position = step + 1
            if not self.reruns:
                self.kept.clear()
        if commit or not self.reruns:
            self.step = step + 1
        return StepResult(
            step=step,
            entries=entries,
            kept={i: _tensor(entries[i].digest) for i in keep if i < len(entries)},
            ops=[o for o in outcome.ops if ops == "all" or o.phase == ops] if ops else None,
            loss=outcome.loss,
            outcome=digest(sorted(self.state.items())),
            streams_after={n: tree_digest(v) for n, v in self.rng.items()},
            seeding=list(outcome.seeding),
            batch=batch.content if not self.program.reruns else None,
        )

    def streams(self, step: int) -> StepStart:
        """The streams a kept step starts from, after its batch was fetched and before, and its data
        position."""
        self._check()
        start = self._kept(step)
        if not self.program.reruns:  # a framework's hooks see the streams once the batch was drawn
            return StepStart(
                streams=dict(start.streams), pre_streams=dict(start.streams), data=None
            )
        return StepStart(
            streams=dict(start.streams), pre_streams=dict(start.pre_streams), data=dict(start.data)
        )

    def data(
        self,
        step: int,
        *,
        pre_streams: dict[str, Any] | None = None,
        epoch_streams: dict[str, Any] | None = None,
    ) -> Fetched:
        """A kept step's batch fetched again from its data position, under other streams (nothing
        else changes); a fake loader has no epoch streams."""
        self._check()
        if not self.program.reruns:
            raise ReplicaFailed(
                f"replay of {self.label}: 'data' needs the batch fetched again, which a "
                "framework's loader does not allow"
            )
        start = self._kept(step)
        return self._fetched(
            start,
            self.program.loader(start.data["position"], dict(pre_streams or start.pre_streams)),
        )

    def hashes(self) -> dict[str, str]:
        self._check()
        return dict(self.state)

    def describe(self) -> Description:
        self._check()
        streams = {n: tree_digest(v) for n, v in self.rng.items()}
        return Description(
            init=dict(self.state),
            streams=streams,
            hidden={},
            environment=dict(self.settings),
            threads_set=[],
            loader={},
            convolutions=False,
            build_seeding=[],
        )

    def compiled(self) -> list[CompileCall]:
        """A program calls no ``torch.compile``."""
        self._check()
        return []

    def items_change(self, step: int, stream: str) -> bool | None:
        """Unknown: a fake loader has no dataset of its own to ask."""
        return None

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeReplica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Launcher:
    """Starts a fake replica for a spec, as :func:`~bisect_repro.replay.ranked.start_replica` starts
    a process: the program is the one of the spec's ``path``; ``started`` lists each replica
    started."""

    def __init__(self, programs: Mapping[str, Program]) -> None:
        self.programs = programs
        self.started: list[FakeReplica] = []

    def __call__(self, spec: LaunchSpec, label: str) -> FakeReplica:
        replica = FakeReplica(self.programs[spec.path or ""], label, spec)
        self.started.append(replica)
        return replica


# mypy checks the fake against the interface the replay and diagnose/ are typed against
if TYPE_CHECKING:
    _FAKE: type[ReplicaLike] = FakeReplica
    _LAUNCHER: Callable[[Mapping[str, Program]], ReplicaFactory] = Launcher
