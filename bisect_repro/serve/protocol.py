"""The replay protocol: every request a controller sends a replaying process, and every reply.

Both sides import this module: the controller (:class:`~bisect_repro.replay.replica.Replica`)
builds requests and reads replies through these types, the replaying process
(:class:`~bisect_repro.serve.server.StepServer`) reads requests and builds replies through them,
so no field is named twice. Each message is a JSON object on the
:class:`~bisect_repro.serve.channel.Channel` (``op`` names a request), plus, for the few that carry
tensors or random-stream states, a state tree beside it. The requests, and the one encoder and
decoder both ends use, are in :mod:`bisect_repro.serve.requests`.

========== ================================== ============================================
request    class (:mod:`~.requests`)          reply
========== ================================== ============================================
restore    ``Restore``                        :class:`Restored`
skip       ``Skip``                           :class:`SkipResult` (and ``{progress}`` lines)
fetch      ``Fetch``                          :class:`Fetched`
run        ``Run`` (tree: streams)            :class:`StepResult` (tree: kept tensors)
rewind     ``Rewind``                         :class:`Rewound` (a script's or framework's process)
streams    ``Streams``                        :class:`StepStart` (as a tree)
data       ``Data`` (tree: streams)           :class:`Fetched`
hashes     ``Hashes``                         :class:`StateHashes`
describe   ``Describe``                       :class:`Description`
items      ``Items``                          :class:`ItemsChange`
compiled   ``Compiled``                       :class:`CompileCalls`
exit       ``Exit``                           :class:`Exited`
========== ================================== ============================================

A reply ``{"error": ...}`` answers any request the process could not serve. Each request class
names its reply's class (``Restore(Asks[Restored])``); the controller reads every reply through the
one decoder, :func:`bisect_repro.serve.replies.decode_reply`.

Where the guarantees stop: both ends are this package at one version (the controller starts the
process with its own ``PYTHONPATH``); the replies come from a process that runs the user's code,
so they are read as data and never evaluated, but they are not validated field by field the way
a run directory is (:mod:`bisect_repro.store.meta`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..capture.compiled import CompileCall
from ..capture.trace import OpRecord, TraceEntry

__all__ = [
    "CompileCalls",
    "Description",
    "Exited",
    "Fetched",
    "Hello",
    "HiddenStream",
    "ItemsChange",
    "Reply",
    "Restored",
    "Rewound",
    "SkipResult",
    "StateHashes",
    "StepRecord",
    "StepResult",
    "StepStart",
]


@dataclass(frozen=True, kw_only=True)
class Hello:
    """What a replaying process says first: who it is and what its model looks like."""

    pid: int
    rank: int = 0
    world_size: int = 1
    structure: Any = None
    """The model's structure (:func:`~bisect_repro.capture.state.model_structure`)."""
    reruns: bool = True
    """Whether a kept step can run again in this process (``False`` when a framework drives the
    loop: each repeat of a step is then a fresh process)."""
    rewinds: bool = False
    """Whether a process that runs each step once can run the last fetched step again by rewinding
    to its start (``rewind``, see :mod:`bisect_repro.serve.rewind`)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Hello:
        return cls(
            pid=pid if type(pid := data.get("pid")) is int else 0,
            rank=data.get("rank", 0),  # checked by the ranked replica, which names a bad one
            world_size=data.get("world_size", 1),
            structure=data.get("structure"),
            reruns=bool(data.get("reruns", True)),
            rewinds=bool(data.get("rewinds", False)),
        )


# -- replies --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Fetched:
    """A batch taken (``fetch``) or taken again under other streams (``data``): its sample indices
    when a sampler gave them, and the digests the recorder logs."""

    step: int | None = None
    indices: list[int] | None = None
    order: str | None = None
    """The digest of the indices (``None`` without a sampler's indices)."""
    batch: str | None = None
    """The digest of the batch (``None`` in a framework's loop, until the step runs)."""
    base_seed: int | None = None
    """The loader's base seed for this epoch's workers."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fetched:
        return cls(
            **{name: data.get(name) for name in ("step", "indices", "order", "batch", "base_seed")}
        )

    def digest(self, kind: str) -> str | None:
        """The digest of one kind: ``order`` or ``batch``."""
        return self.order if kind == "order" else self.batch


@dataclass(frozen=True, kw_only=True)
class StepStart:
    """The streams a kept step starts from (as a state tree: the states themselves)."""

    streams: dict[str, Any]
    """After its batch was fetched: what the step's own code draws from."""
    pre_streams: dict[str, Any]
    """Before the batch was fetched: what the data drew from."""
    data: dict[str, Any] | None
    """The data position before the fetch (``None`` when a framework owns the loader)."""

    def to_tree(self) -> dict[str, Any]:
        return {"streams": self.streams, "pre_streams": self.pre_streams, "data": self.data}

    @classmethod
    def from_tree(cls, tree: dict[str, Any]) -> StepStart:
        return cls(
            streams=dict(tree.get("streams") or {}),
            pre_streams=dict(tree.get("pre_streams") or {}),
            data=tree.get("data"),
        )


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """What the recorder would have logged for one step trained untraced."""

    step: int
    order: str | None
    batch: str | None
    loss: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        return cls(
            step=int(data["step"]),
            order=data.get("order"),
            batch=data.get("batch"),
            loss=data.get("loss"),
        )


@dataclass(frozen=True, kw_only=True)
class Restored:
    """The reply to ``restore``: the step the process now stands at the start of."""

    step: int

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Restored:
        return cls(step=int(data["step"]))


@dataclass(frozen=True, kw_only=True)
class Rewound:
    """The reply to ``rewind``: the step the process stands at the start of again, and whether the
    step's data draws moved a random stream (:mod:`bisect_repro.serve.rewind`)."""

    step: int
    consumes: bool

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "consumes": self.consumes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rewound:
        return cls(step=int(data["step"]), consumes=bool(data.get("consumes")))


@dataclass(frozen=True, kw_only=True)
class Exited:
    """The reply to ``exit``, sent just before the process ends."""

    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Exited:
        return cls(ok=bool(data.get("ok")))


@dataclass(frozen=True, kw_only=True)
class StateHashes:
    """The reply to ``hashes``: the hash of every tensor of the state now."""

    hashes: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"hashes": self.hashes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateHashes:
        return cls(hashes={str(k): str(v) for k, v in dict(data["hashes"]).items()})


@dataclass(frozen=True, kw_only=True)
class ItemsChange:
    """The reply to ``items``: whether the items change (``None``: not known, no indices or no
    dataset to ask)."""

    changes: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"changes": self.changes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemsChange:
        changes = data.get("changes")
        return cls(changes=None if changes is None else bool(changes))


@dataclass(frozen=True, kw_only=True)
class CompileCalls:
    """The reply to ``compiled``: the ``torch.compile`` calls the code made."""

    calls: list[CompileCall]

    def to_json(self) -> dict[str, Any]:
        return {"calls": [call.to_json() for call in self.calls]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompileCalls:
        return cls(calls=[CompileCall.from_json(call) for call in data.get("calls", [])])


@dataclass
class SkipResult:
    """Steps trained untraced: what the recorder would have logged, and state hashes where asked."""

    step: int
    """The step the process stands at now."""
    records: list[StepRecord] = field(default_factory=list)
    hashes: dict[int, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "records": [r.to_json() for r in self.records],
            "hashes": {str(k): v for k, v in self.hashes.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SkipResult:
        return cls(
            step=int(data["step"]),
            records=[StepRecord.from_json(r) for r in data.get("records", [])],
            hashes={int(k): dict(v) for k, v in (data.get("hashes") or {}).items()},
        )


@dataclass(frozen=True, kw_only=True)
class HiddenStream:
    """A generator held by the code outside the global streams (a dataset's, a model's)."""

    kind: str
    digest: str


@dataclass(frozen=True, kw_only=True)
class Description:
    """What ``doctor`` asks of a freshly built process."""

    init: dict[str, str]
    """The hash of every tensor of the initial state."""
    streams: dict[str, str]
    """The digest of each recorded stream's state."""
    hidden: dict[str, HiddenStream]
    environment: dict[str, Any]
    """The process's fingerprint (:func:`~bisect_repro.capture.env.fingerprint`)."""
    threads_set: list[int]
    """Thread counts the code set with ``torch.set_num_threads``."""
    loader: dict[str, Any]
    convolutions: bool
    """Whether the model has convolutions (``cudnn.benchmark`` matters)."""
    build_seeding: list[dict[str, Any]]
    """The seeding calls made while the code built the model."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Description:
        return cls(
            init=dict(data["init"]),
            streams=dict(data["streams"]),
            hidden={
                name: HiddenStream(kind=str(h["kind"]), digest=str(h["digest"]))
                for name, h in data["hidden"].items()
            },
            environment=dict(data["environment"]),
            threads_set=[int(n) for n in data["threads_set"]],
            loader=dict(data["loader"]),
            convolutions=bool(data["convolutions"]),
            build_seeding=list(data["build_seeding"]),
        )


@dataclass
class StepResult:
    """A step run again (the reply to ``run``)."""

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

    def to_reply(self) -> tuple[dict[str, Any], Any]:
        """The reply as JSON, and its tree (the kept tensors)."""
        reply: dict[str, Any] = {
            "step": self.step,
            "loss": self.loss,
            "outcome": self.outcome,
            "streams_after": self.streams_after,
            "seeding": self.seeding,
            "entries": [[e.phase, e.layer, e.tensor, e.digest] for e in self.entries],
            "alerts": self.alerts,
            "batch": self.batch,
        }
        if self.ops is not None:
            reply["ops"] = [
                [r.op, r.layer, r.phase, list(r.inputs), list(r.outputs), r.arguments]
                for r in self.ops
            ]
        return reply, ({"kept": {str(k): v for k, v in self.kept.items()}} if self.kept else None)

    @classmethod
    def from_reply(cls, reply: dict[str, Any], tree: Any) -> StepResult:
        ops = reply.get("ops")
        return cls(
            step=int(reply["step"]),
            entries=[TraceEntry(*entry) for entry in reply.get("entries", [])],
            kept={int(k): v for k, v in ((tree or {}).get("kept") or {}).items()},
            ops=[
                OpRecord(op, layer, tuple(i), tuple(o), arguments, phase)
                for op, layer, phase, i, o, arguments in ops
            ]
            if ops is not None
            else None,
            alerts=list(reply.get("alerts", [])),
            loss=reply.get("loss"),
            outcome=reply.get("outcome", ""),
            streams_after=dict(reply.get("streams_after", {})),
            seeding=list(reply.get("seeding", [])),
            batch=reply.get("batch"),
        )


Reply = (
    Restored
    | SkipResult
    | Fetched
    | StepResult
    | Rewound
    | StepStart
    | StateHashes
    | Description
    | ItemsChange
    | CompileCalls
    | Exited
)
"""Every reply a replaying process sends (a request's class names which)."""
