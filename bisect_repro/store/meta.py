"""``run.json`` and ``rank.json``, parsed once into typed, validated objects.

A run directory is handed around (a colleague's cluster, a CI artifact, a bug report), so every
field of it is hostile input. :meth:`RunMeta.parse` and :meth:`RankMeta.parse` check every
field's type and bounds at the store boundary and raise one :class:`RunFormatError` naming the
file, the field and the fix; past it, code reads typed attributes, never ``meta.get(...)``.

Design decisions:
- The launch (:class:`LaunchRecord`) is what ``compare`` may run again, so it is checked the
  most strictly: strings without NUL, argv a list of strings, the code's kind one of three.
  Whether it *may* run is decided elsewhere (:mod:`bisect_repro.store.signing` and
  :mod:`bisect_repro.replay.launch`); this module only guarantees its shape.
- Environment variables (``env.NAME`` keys of the fingerprint) must have names a shell accepts
  and values without NUL; the in-process settings that :func:`bisect_repro.capture.env.apply`
  sets are bounded (a thread count from 1 to 4,096, booleans, a known matmul precision).
- :attr:`RunMeta.raw` keeps the JSON as read, for ``show`` and for the signature check, which
  must see the very bytes' values that were signed.

Where the guarantees stop: free-form objects (``config``, ``loader``, a framework's extra
environment keys) are checked to be JSON objects, not interpreted; their values are data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import RunFormatError

__all__ = [
    "CodeKind",
    "CodeRecord",
    "Distributed",
    "LaunchRecord",
    "RankMeta",
    "Resume",
    "RunMeta",
    "RunOptions",
    "Signature",
]

FORMAT = 1
"""The format of a single-process run, as it always was."""
DISTRIBUTED_FORMAT = 2
"""The format of a distributed run, and the newest this reads."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEX = re.compile(r"[0-9a-f]+")
_PRECISIONS = ("highest", "high", "medium")
_MAX_THREADS = 4096
_DAMAGED = "the file is damaged or was edited; record the run again"


class CodeKind(str, Enum):
    """What a run's launch ran: a recipe TARGET, a script (``python train.py``) or a module
    (``-m``)."""

    RECIPE = "recipe"
    SCRIPT = "script"
    MODULE = "module"


class _Fields:
    """Reads one JSON object's fields with their types checked; errors name the file and the
    field."""

    def __init__(self, path: Path, where: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise RunFormatError(
                path, f"{where or 'the file'} is a {_kind(value)}, not an object", _DAMAGED
            )
        self.path, self.where, self.value = path, where, value

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def bad(self, key: str, problem: str) -> RunFormatError:
        return RunFormatError(self.path, f"{self._name(key)!r} {problem}", _DAMAGED)

    def get(self, key: str, kinds: type | tuple[type, ...], default: Any = None) -> Any:
        if key not in self.value:
            return default
        value = self.value[key]
        if value is None and default is None:  # null where the field is optional
            return None
        ok = isinstance(value, kinds) and not (
            isinstance(value, bool) and bool not in _as_tuple(kinds)
        )
        if not ok:
            raise self.bad(key, f"is a {_kind(value)}")
        if isinstance(value, str) and "\x00" in value:
            raise self.bad(key, "holds a NUL character")
        return value

    def count(
        self, key: str, default: int | None = 0, *, least: int = 0, most: int | None = None
    ) -> Any:
        value = self.get(key, (int, type(None)) if default is None else int, default)
        if value is not None and (value < least or (most is not None and value > most)):
            raise self.bad(
                key, f"is {value}, below {least}" if value < least else f"is {value}, above {most}"
            )
        return value

    def text(self, key: str, default: str | None = None) -> Any:
        return self.get(key, (str, type(None)), default)

    def strings(self, key: str) -> tuple[str, ...]:
        values = self.get(key, list, [])
        for value in values:
            if not isinstance(value, str) or "\x00" in value:
                raise self.bad(key, "holds something other than text")
        return tuple(values)

    def sub(self, key: str) -> _Fields | None:
        value = self.value.get(key)
        return None if value is None else _Fields(self.path, self._name(key), value)


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


@dataclass(frozen=True, kw_only=True)
class CodeRecord:
    """The code a run ran, with its content hash."""

    kind: CodeKind
    path: str | None
    """The file: the recipe file, the script, or the module's file (absolute, as recorded)."""
    sha256: str | None
    target: str | None = None
    """The recipe TARGET (``recipe``)."""
    module: str | None = None
    """The module run as ``__main__`` (``module``)."""

    @classmethod
    def parse(cls, fields: _Fields) -> CodeRecord:
        kind = fields.text("kind")
        if kind not in {k.value for k in CodeKind}:
            raise fields.bad("kind", f"is {kind!r}, not one of recipe, script, module")
        digest = fields.text("sha256")
        if digest is not None and (len(digest) != 64 or not _HEX.fullmatch(digest)):
            raise fields.bad("sha256", "is not a SHA-256 in hexadecimal")
        return cls(
            kind=CodeKind(kind),
            path=fields.text("path"),
            sha256=digest,
            target=fields.text("target"),
            module=fields.text("module"),
        )


@dataclass(frozen=True, kw_only=True)
class LaunchRecord:
    """How a run was launched: what ``compare`` may run again (see
    :mod:`bisect_repro.replay.launch`)."""

    executable: str | None
    argv: tuple[str, ...]
    cwd: str | None
    code: CodeRecord | None
    auto: bool = False
    """Recorded unchanged under bisect-repro's hooks (``hooks: "auto"``), and replayed so."""

    @classmethod
    def parse(cls, fields: _Fields) -> LaunchRecord:
        code = fields.sub("code")
        hooks = fields.text("hooks")
        if hooks not in (None, "auto"):
            raise fields.bad("hooks", f"is {hooks!r}, not auto")
        return cls(
            executable=fields.text("executable"),
            argv=fields.strings("argv"),
            cwd=fields.text("cwd"),
            code=CodeRecord.parse(code) if code is not None else None,
            auto=hooks == "auto",
        )


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The recording's schedule and how it may be replayed."""

    steps: int | None = None
    every: int = 10
    checkpoint_every: int | None = 100
    force: bool = False
    on_error: str = "raise"
    start_step: int = 0
    """The first step recorded (a run resumed from another's checkpoint starts later)."""
    resumed_from: tuple[str, int] | None = None
    """The run and step this one was started from (``Recorder(resume_from=...)``)."""
    replay: str = "from_checkpoint"
    """``from_checkpoint`` (a loop of batches) or ``from_start`` (a framework's hooks)."""
    accumulate: int = 1
    """Micro-batches per step (gradient accumulation)."""

    @classmethod
    def parse(cls, fields: _Fields) -> RunOptions:
        resumed = fields.get("resumed_from", list, None)
        if resumed is not None and not (
            len(resumed) == 2 and isinstance(resumed[0], str) and type(resumed[1]) is int
        ):
            raise fields.bad("resumed_from", "is not [run, step]")
        replay = fields.text("replay", "from_checkpoint")
        if replay not in ("from_checkpoint", "from_start"):
            raise fields.bad("replay", f"is {replay!r}, not from_checkpoint or from_start")
        return cls(
            steps=fields.count("steps", None),
            every=fields.count("every", 10, least=1),
            checkpoint_every=fields.count("checkpoint_every", None, least=1)
            if "checkpoint_every" in fields.value
            else 100,
            force=fields.get("force", bool, False),
            on_error=fields.text("on_error", "raise"),
            start_step=fields.count("start_step", 0),
            accumulate=fields.count("accumulate", 1, least=1),
            resumed_from=(resumed[0], resumed[1]) if resumed is not None else None,
            replay=replay,
        )


@dataclass(frozen=True, kw_only=True)
class Distributed:
    """A distributed run's layout (``run.json``'s ``distributed``)."""

    world_size: int
    backend: str | None = None
    layout: str = "single"
    """``single``, ``ddp``, ``fsdp`` or ``dtensor``."""
    mesh: dict[str, Any] | None = None
    replicated: str = "none"
    rank_local: tuple[str, ...] = ()
    launcher: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, fields: _Fields) -> Distributed:
        mesh = fields.get("mesh", (dict, type(None)), None)
        shape = (mesh or {}).get("shape")
        if shape is not None and not (
            isinstance(shape, list) and all(type(n) is int and n > 0 for n in shape)
        ):
            raise fields.bad("mesh", "has a shape that is not a list of sizes")
        return cls(
            # every reader walks the ranks it declares
            world_size=fields.count("world_size", 1, least=1, most=1 << 20),
            backend=fields.text("backend"),
            layout=fields.text("layout", "single") or "single",
            mesh=mesh,
            replicated=fields.text("replicated", "none") or "none",
            rank_local=fields.strings("rank_local"),
            launcher=fields.get("launcher", dict, {}),
        )


@dataclass(frozen=True, kw_only=True)
class Resume:
    """One ``record --resume`` of the run: the step it went on from and what had changed."""

    step: int
    created: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Signature:
    """The recorder's signature over the launch claim (see :mod:`bisect_repro.store.signing`)."""

    key: str
    """The signing key's identifier (not the key)."""
    mac: str
    """HMAC-SHA256 of the claim, hexadecimal."""


def _environment(fields: _Fields, key: str) -> dict[str, Any]:
    environment: dict[str, Any] = fields.get(key, dict, {})
    for name, value in environment.items():
        if name.startswith("env."):
            if not _ENV_NAME.fullmatch(name[4:]):
                raise fields.bad(
                    key, f"names an environment variable {name[4:]!r} that is not a variable name"
                )
            if value is not None and (not isinstance(value, str) or "\x00" in value):
                raise fields.bad(key, f"gives {name} a value that is not text")
    threads = environment.get("torch.get_num_threads")
    if threads is not None and not (type(threads) is int and 1 <= threads <= _MAX_THREADS):
        raise fields.bad(key, f"has a thread count of {threads!r}, not 1 to {_MAX_THREADS}")
    from ..capture.env import SWITCHES  # torch's: imported where an environment is checked

    for name in SWITCHES:
        if environment.get(name) is not None and not isinstance(environment[name], bool):
            raise fields.bad(key, f"has {name} = {environment[name]!r}, not true or false")
    precision = environment.get("torch.get_float32_matmul_precision")
    if precision is not None and precision not in _PRECISIONS:
        raise fields.bad(
            key, f"has a matmul precision of {precision!r}, not one of {', '.join(_PRECISIONS)}"
        )
    return environment


def _model(fields: _Fields) -> dict[str, dict[str, Any]]:
    model: dict[str, Any] = fields.get("model", dict, {})
    for kind, tensors in model.items():
        if not isinstance(tensors, dict):
            raise fields.bad("model", "does not map kinds to tensors")
        # others: placements, data only
        for name, described in tensors.items() if kind in ("parameters", "buffers") else ():
            ok = (
                isinstance(described, list)
                and len(described) == 2
                and isinstance(described[1], str)
            )
            if (
                not ok
                or not isinstance(described[0], list)
                or not all(type(n) is int and n >= 0 for n in described[0])
            ):
                raise fields.bad(
                    "model", f"describes {kind} {name!r} as something other than [shape, dtype]"
                )
    return model


@dataclass(frozen=True, kw_only=True)
class RunMeta:
    """``run.json``: what a run is, how it was recorded and launched, on what environment."""

    format: int
    target: str | None = None
    """The recipe TARGET (``None`` for a loop of one's own or a framework's)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The recipe's keyword arguments, or the script's arguments and hyperparameters."""
    options: RunOptions = field(default_factory=RunOptions)
    created: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    """The environment fingerprint (:func:`bisect_repro.capture.env.fingerprint`), validated."""
    model: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{kind: {name: [shape, dtype]}}`` for parameters and buffers (``dtensors``: their
    placements)."""
    loader: dict[str, Any] = field(default_factory=dict)
    streams: tuple[str, ...] = ()
    resumes: tuple[Resume, ...] = ()
    distributed: Distributed | None = None
    launch: LaunchRecord | None = None
    signature: Signature | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The JSON object as read."""

    @classmethod
    def parse(cls, path: Path, value: Any) -> RunMeta:
        """Validate ``run.json``'s parsed JSON; one :class:`RunFormatError` for the first bad
        field."""
        if not isinstance(value, dict) or type(value.get("format")) is not int:
            raise RunFormatError(
                path, "no format version", "the file is damaged or not a bisect-repro run"
            )
        version = value["format"]
        if version > DISTRIBUTED_FORMAT:
            raise RunFormatError(
                path,
                f"format {version} is newer than this bisect-repro reads ({DISTRIBUTED_FORMAT})",
                "upgrade bisect-repro",
            )
        if version < 1:
            raise RunFormatError(path, f"unknown format version {version}", "the file is damaged")
        fields = _Fields(path, "", value)
        if (version >= 2) != ("distributed" in value):
            without = "out" if version >= 2 else ""
            raise RunFormatError(
                path, f"format {version} with{without} 'distributed'", "the file is damaged"
            )
        options, distributed, launch, signature = (
            fields.sub("options"),
            fields.sub("distributed"),
            fields.sub("launch"),
            fields.sub("signature"),
        )
        resumes = []
        for item in fields.get("resumes", list, []):
            resume = _Fields(path, "resumes[]", item)
            resumes.append(
                Resume(
                    step=resume.count("step"),
                    created=resume.text("created"),
                    environment=resume.get("environment", dict, {}),
                )
            )
        if signature is not None:
            key, mac = signature.text("key") or "", signature.text("mac") or ""
            if not _HEX.fullmatch(key) or not _HEX.fullmatch(mac):
                raise signature.bad("mac", "is not hexadecimal")
        return cls(
            format=version,
            target=fields.text("target"),
            config=fields.get("config", dict, {}),
            options=RunOptions.parse(options) if options is not None else RunOptions(),
            created=fields.text("created"),
            environment=_environment(fields, "environment"),
            model=_model(fields),
            loader=fields.get("loader", dict, {}),
            streams=fields.strings("streams"),
            resumes=tuple(resumes),
            distributed=Distributed.parse(distributed) if distributed is not None else None,
            launch=LaunchRecord.parse(launch) if launch is not None else None,
            signature=Signature(key=key, mac=mac) if signature is not None else None,
            raw=value,
        )

    @property
    def world_size(self) -> int:
        return self.distributed.world_size if self.distributed is not None else 1


@dataclass(frozen=True, kw_only=True)
class RankMeta:
    """``rank{r}/rank.json`` of a distributed run: who the rank was, where it ran, its
    environment."""

    rank: int
    world_size: int | None = None
    hostname: str | None = None
    device: str | None = None
    replica_group: tuple[int, ...] | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, path: Path, value: Any, rank: int) -> RankMeta:
        fields = _Fields(path, "", value)
        if fields.value.get("rank") != rank or type(fields.value.get("rank")) is not int:
            raise RunFormatError(
                path, f"does not describe rank {rank}", "the file is damaged or was moved"
            )
        group = fields.get("replica_group", (list, type(None)), None)
        if group is not None and not all(type(r) is int and r >= 0 for r in group):
            raise fields.bad("replica_group", "is not a list of ranks")
        return cls(
            rank=rank,
            world_size=fields.count("world_size", None, least=1),
            hostname=fields.text("hostname"),
            device=fields.text("device"),
            replica_group=tuple(group) if group is not None else None,
            environment=_environment(fields, "environment"),
            raw=value,
        )
