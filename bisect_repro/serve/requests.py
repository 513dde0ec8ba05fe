"""The requests of the replay protocol: one frozen dataclass each, named on the wire by its ``op``.

A controller builds a request and :func:`encode` turns it into what the
:class:`~bisect_repro.serve.channel.Channel` sends: a JSON object (``op`` and the fields), and
beside it a state tree holding the fields that carry random-stream states (``TREE``: a
:class:`Run`'s ``streams``, a :class:`Data`'s ``pre_streams`` and ``epoch_streams``), sent as they
are. The replaying process reads it back with :func:`decode`, through :data:`REQUESTS`, the one
table from an ``op`` to its class; a server answers each decoded request by its type
(:data:`~bisect_repro.serve.server.ANSWERS`). Each request names the class of its reply
(``class Restore(Asks[Restored])``): the replies are in :mod:`bisect_repro.serve.protocol`, read
back by the controller through :mod:`bisect_repro.serve.replies`.

Where the guarantees stop: both ends are this package at one version, so a field is read as the
other end wrote it (numbers as numbers); an ``op`` no class has is refused
(:class:`UnknownRequest`), a field of the wrong type is not checked one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, Literal, TypeVar

from .protocol import (
    CompileCalls,
    Description,
    Exited,
    Fetched,
    ItemsChange,
    Restored,
    Rewound,
    SkipResult,
    StateHashes,
    StepResult,
    StepStart,
)

__all__ = [
    "REQUESTS",
    "Asks",
    "Compiled",
    "Data",
    "Describe",
    "Exit",
    "Fetch",
    "Hashes",
    "Items",
    "Request",
    "Restore",
    "Rewind",
    "Run",
    "Skip",
    "Streams",
    "Trace",
    "UnknownRequest",
    "decode",
    "encode",
]

Trace = Literal["none", "light", "full"]
"""How much of a step is traced: nothing, the batch and the outcome, or every tensor."""


class UnknownRequest(ValueError):
    """A message whose ``op`` names no request."""


_B = TypeVar("_B", bound="_Bare")
_R = TypeVar("_R", covariant=True)


@dataclass(frozen=True, kw_only=True)
class Asks(Generic[_R]):
    """What every request is: a frozen dataclass named on the wire by its ``op``, answered by a
    reply of class ``_R`` (:mod:`bisect_repro.serve.protocol`), which
    :func:`~bisect_repro.serve.replies.decode_reply` reads back."""

    op: ClassVar[str]
    TREE: ClassVar[tuple[str, ...]] = ()
    """The fields sent in the state tree beside the message, not in it."""


class _Bare:
    """A request with no field but its ``op``."""

    @classmethod
    def from_json(cls: type[_B], data: Mapping[str, Any]) -> _B:
        return cls()


@dataclass(frozen=True, kw_only=True)
class Restore(Asks[Restored]):
    """Load a checkpoint of a run directory (read, never executed) and its in-process settings."""

    op: ClassVar[Literal["restore"]] = "restore"
    run: str
    step: int
    environment: dict[str, Any] = field(default_factory=dict)
    rebuilt: bool = False
    """Keep the hyperparameters the code was built with (another config), not the checkpoint's."""
    kept_from: int | None = None
    """From this step on, every call that would reseed a stream from entropy leaves it as it is
    (before it, each is given its recorded value)."""
    seeded: tuple[str, ...] = ()
    """The global streams this process's launch seeded: a script's or framework's process leaves
    them as seeded at its start instead of loading them from the checkpoint (a recipe's step
    server loads every stream)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Restore:
        kept, seeded = data.get("kept_from"), data.get("seeded") or ()
        return cls(
            run=str(data["run"]),
            step=int(data["step"]),
            environment=dict(data.get("environment") or {}),
            rebuilt=bool(data.get("rebuilt")),
            kept_from=None if kept is None else int(kept),
            seeded=tuple(str(name) for name in seeded),
        )


@dataclass(frozen=True, kw_only=True)
class Skip(Asks[SkipResult]):
    """Train untraced up to ``until``, with the state hashes at the steps in ``hashes_at``."""

    op: ClassVar[Literal["skip"]] = "skip"
    until: int
    hashes_at: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Skip:
        return cls(
            until=int(data["until"]), hashes_at=tuple(int(s) for s in data.get("hashes_at", ()))
        )


@dataclass(frozen=True, kw_only=True)
class Fetch(Asks[Fetched]):
    """Take the next batch and keep, in memory, everything the step starts from; forget the kept
    steps not in ``keep``."""

    op: ClassVar[Literal["fetch"]] = "fetch"
    keep: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fetch:
        return cls(keep=tuple(int(s) for s in data.get("keep", ())))


@dataclass(frozen=True, kw_only=True)
class Run(Asks[StepResult]):
    """Run a kept step again from its start."""

    op: ClassVar[Literal["run"]] = "run"
    TREE: ClassVar[tuple[str, ...]] = ("streams",)
    step: int
    trace: Trace = "light"
    keep: tuple[int, ...] = ()
    """Indices of trace entries whose tensors come back as copies."""
    ops: str | None = None
    """Record every aten op of one pass: ``forward``, ``backward`` or ``all``."""
    alerts: bool = False
    """Catch PyTorch's warnings about ops with no deterministic kernel."""
    environment: dict[str, Any] | None = None
    """In-process settings to run under (another run's), undone after the step."""
    advance: tuple[str, ...] = ()
    """Streams drawn from once before the step."""
    fixed_entropy: int | None = None
    """Seed every call that would seed from entropy with this value instead."""
    kept_entropy: bool = False
    """Every call that would seed from entropy leaves its stream as it is (the step's recorded
    values not given), as in a process restored with ``kept_from`` at this step."""
    commit: bool = False
    """Move on to the next step afterwards (only from the latest kept step)."""
    compile_bisect: str | None = None
    """Compile the model again first, as one trial of the compiler bisection whose state is in this
    folder."""
    streams: dict[str, Any] | None = None
    """The random streams to run under instead of the step's own (a state tree)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Run:
        return cls(
            step=int(data["step"]),
            trace=data.get("trace", "light"),
            keep=tuple(int(i) for i in data.get("keep", ())),
            ops=data.get("ops"),
            alerts=bool(data.get("alerts")),
            environment=data.get("environment"),
            advance=tuple(str(s) for s in data.get("advance", ())),
            fixed_entropy=data.get("fixed_entropy"),
            kept_entropy=bool(data.get("kept_entropy", False)),
            commit=bool(data.get("commit")),
            compile_bisect=data.get("compile_bisect"),
            streams=data.get("streams"),
        )


@dataclass(frozen=True, kw_only=True)
class Streams(Asks[StepStart]):
    """The streams a kept step starts from, after its batch was fetched and before, and its data
    position."""

    op: ClassVar[Literal["streams"]] = "streams"
    step: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Streams:
        return cls(step=int(data["step"]))


@dataclass(frozen=True, kw_only=True)
class Rewind(Asks[Rewound]):
    """Run the last fetched step again: put its kept start back at the next step's start and feed
    its batches again (a process that runs each step once; :mod:`bisect_repro.serve.rewind`)."""

    op: ClassVar[Literal["rewind"]] = "rewind"
    step: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rewind:
        return cls(step=int(data["step"]))


@dataclass(frozen=True, kw_only=True)
class Data(Asks[Fetched]):
    """A kept step's batch fetched again from its data position, under other streams (state trees;
    ``None``: the step's own)."""

    op: ClassVar[Literal["data"]] = "data"
    TREE: ClassVar[tuple[str, ...]] = ("pre_streams", "epoch_streams")
    step: int
    pre_streams: dict[str, Any] | None = None
    epoch_streams: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Data:
        return cls(
            step=int(data["step"]),
            pre_streams=data.get("pre_streams"),
            epoch_streams=data.get("epoch_streams"),
        )


@dataclass(frozen=True, kw_only=True)
class Items(Asks[ItemsChange]):
    """Whether the dataset's items at a kept step's indices change with ``stream`` one draw
    further."""

    op: ClassVar[Literal["items"]] = "items"
    step: int
    stream: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Items:
        return cls(step=int(data["step"]), stream=str(data["stream"]))


@dataclass(frozen=True, kw_only=True)
class Hashes(_Bare, Asks[StateHashes]):
    """The hash of every tensor of the state now."""

    op: ClassVar[Literal["hashes"]] = "hashes"


@dataclass(frozen=True, kw_only=True)
class Describe(_Bare, Asks[Description]):
    """What ``doctor`` asks of a freshly built process."""

    op: ClassVar[Literal["describe"]] = "describe"


@dataclass(frozen=True, kw_only=True)
class Compiled(_Bare, Asks[CompileCalls]):
    """The ``torch.compile`` calls the replayed code made."""

    op: ClassVar[Literal["compiled"]] = "compiled"


@dataclass(frozen=True, kw_only=True)
class Exit(_Bare, Asks[Exited]):
    """End the process (the rest of its script does not run)."""

    op: ClassVar[Literal["exit"]] = "exit"


Request = (
    Restore
    | Skip
    | Fetch
    | Run
    | Rewind
    | Streams
    | Data
    | Items
    | Hashes
    | Describe
    | Compiled
    | Exit
)
"""Every request a controller sends a replaying process."""

REQUESTS: dict[str, type[Request]] = {
    cls.op: cls
    for cls in (
        Restore,
        Skip,
        Fetch,
        Run,
        Rewind,
        Streams,
        Data,
        Items,
        Hashes,
        Describe,
        Compiled,
        Exit,
    )
}
"""Each request's class, by its ``op``."""


def encode(request: Asks[Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The message a request is sent as (``op`` and its JSON fields), and the state tree beside it
    (its ``TREE`` fields that are set; ``None`` when none is)."""
    message: dict[str, Any] = {"op": request.op}
    tree: dict[str, Any] = {}
    for f in fields(request):
        value = getattr(request, f.name)
        if f.name not in request.TREE:
            message[f.name] = list(value) if isinstance(value, tuple) else value
        elif value is not None:
            tree[f.name] = value
    return message, tree or None


def decode(message: Mapping[str, Any], tree: Any = None) -> Request:
    """The request a message and its state tree stand for; :class:`UnknownRequest` for an ``op`` no
    class has."""
    op = message.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise UnknownRequest(f"unknown request {op!r}")
    trees = tree if isinstance(tree, dict) else {}
    return cls.from_json({**message, **{name: trees.get(name) for name in cls.TREE}})
