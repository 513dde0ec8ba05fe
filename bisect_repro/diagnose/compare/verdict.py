"""What ``compare`` returns: typed results, turned into JSON only at the edge (``to_json``).

A :class:`Verdict` names a cause only with the experiments that showed it: its ``confidence`` is
``proven`` when an experiment reproduced the difference or made it vanish (each one is an
:class:`Evidence` item), ``inferred`` when only the records speak for it, and ``unexplained``
when the experiments ran and none accounted for the difference.

A :class:`Verdict` is made whole and never changed after: a later stage that says more (the
records' location, a note on what the replay could not prove) makes a new one
(``dataclasses.replace``). The experiments gather what they find in a
:class:`~bisect_repro.diagnose.compare.draft.Draft` and make their verdict from it once.

The JSON form is the ``bisect-repro/compare/2`` object documented in docs/json.md.
Each ``to_json`` names its keys one by one, with every enumeration
(:class:`~bisect_repro.diagnose.compare.causes.Cause`, :class:`Confidence`, :class:`Outcome`)
written as its value: a field added to a class reaches the JSON only when it is added there.
``CompareResult.from_json`` reads such an object back (a key absent from the object takes its
default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ...capture.seeding import SeedingCall
from ...replay.lockstep import Parted
from ..jsonform import ReadBack, known_fields, plain_fields
from ..numerics.numerics_result import Numerics
from ..selfcheck import OpContext
from .causes import Cause
from .compiled import CompileBisect
from .differences import Differences
from .resume import Resume

__all__ = [
    "DIFFERENCE_FIELDS",
    "SCHEMA",
    "CompareResult",
    "Confidence",
    "Evidence",
    "OpContext",
    "Outcome",
    "RankResult",
    "ReplayInfo",
    "TimelineRow",
    "Verdict",
]

SCHEMA = "bisect-repro/compare/2"

DIFFERENCE_FIELDS = ("max_abs_diff", "max_ulp", "fraction_differing", "histogram")
"""A verdict's fields that say how large the first divergent tensor's difference is."""


class Confidence(str, Enum):
    PROVEN = "proven"
    INFERRED = "inferred"
    UNEXPLAINED = "unexplained"


class Outcome(str, Enum):
    """What an experiment showed: the difference (``differs``), none (``matches``: the difference
    vanished or the step repeated), or nothing either way (``inconclusive``)."""

    DIFFERS = "differs"
    MATCHES = "matches"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, init=False)
class Evidence:
    """One experiment and what it showed."""

    experiment: str
    """What was run: ``records``, ``replay``, ``location``, ``self_rerun``, ``reseed_fixed``,
    ``reseed_kept``, ``stream``, ``environment``, ``environment_variables``, ``config``,
    ``data_streams``, ``rebuild``, ``op_trace``, ``compile_bisect``."""
    subject: str
    """Which run it was run on, and how: ``run B with run A's streams``."""
    outcome: Outcome
    """What it showed."""
    detail: str
    """What was seen, in a sentence."""
    narrowed_to: str | None
    """The one name (a stream, a key) the experiment was narrowed to: ``stream:<name>`` in the
    JSON's ``experiment``."""
    run: str | None
    """``A`` or ``B``: the one run the experiment ran on its own (against itself or its own
    records); ``None`` for both runs, or one run under the other's conditions."""

    def __init__(
        self,
        *,
        experiment: str,
        subject: str,
        outcome: Outcome | str,
        detail: str,
        narrowed_to: str | None = None,
        run: str | None = None,
    ) -> None:
        """``outcome`` may be given by its value (``"differs"``); an unknown one raises
        ``ValueError``."""
        for name, value in (
            ("experiment", experiment),
            ("subject", subject),
            ("outcome", Outcome(outcome)),
            ("detail", detail),
            ("narrowed_to", narrowed_to),
            ("run", run),
        ):
            object.__setattr__(self, name, value)  # the instance is frozen

    @property
    def label(self) -> str:
        """The experiment as the JSON and the reports name it: ``stream``, or ``stream:torch``
        where it was narrowed to one name."""
        named = f":{self.narrowed_to}" if self.narrowed_to is not None else ""
        return f"{self.experiment}{named}"

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.label,
            "subject": self.subject,
            "outcome": self.outcome.value,
            "detail": self.detail,
            "run": self.run,
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> Evidence:
        """An item of ``evidence`` read back: its ``experiment`` is ``kind`` or ``kind:name``, the
        JSON form :meth:`to_json` writes (the one place that form is read)."""
        kind, narrowed, name = str(found["experiment"]).partition(":")
        return cls(
            experiment=kind,
            subject=found["subject"],
            outcome=found["outcome"],
            detail=found["detail"],
            narrowed_to=name if narrowed else None,
            run=found.get("run"),
        )


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Where two runs first part ways, why, how sure, and the fix: made whole, never changed after
    (see the module docstring)."""

    step: int
    """The 0-based count of ``step()`` calls before the divergent one (0 for the initial state)."""
    phase: str | None = None
    """``init``, ``data``, ``forward``, ``backward``, ``optimizer`` or ``step`` (the loss, outside
    the model)."""
    layer: str | None = None
    tensor: str | None = None
    op: str | None = None
    rank: int | None = None
    cause: Cause = Cause.UNKNOWN
    confidence: Confidence = Confidence.INFERRED
    rng: list[str] = field(default_factory=list)
    """The random streams the cause names."""
    reseeded: list[SeedingCall] = field(default_factory=list)
    """Seeding calls from entropy the step made (or the step logs show), with their call sites."""
    config_keys: list[str] = field(default_factory=list)
    environment_keys: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None
    max_ulp: int | None = None
    fraction_differing: float | None = None
    histogram: dict[str, int] | None = None
    """Counts of ``|a - b|`` by power of ten over the differing elements of the first divergent
    tensor."""
    explanation: str = ""
    fix: str = ""
    evidence: list[Evidence] = field(default_factory=list)

    def with_difference(self, stats: Mapping[str, Any]) -> Verdict:
        """This verdict with the size of the first divergent tensor's difference (the keys of
        :data:`DIFFERENCE_FIELDS` that ``stats`` holds)."""
        return replace(self, **{k: stats[k] for k in DIFFERENCE_FIELDS if k in stats})

    def to_json(self) -> dict[str, Any]:
        return {
            **plain_fields(self, "step", "phase", "layer", "tensor", "op", "rank"),
            "cause": self.cause.value,
            "confidence": self.confidence.value,
            "rng": self.rng,
            "reseeded": [call.to_json() for call in self.reseeded],
            **plain_fields(
                self,
                "config_keys",
                "environment_keys",
                "max_abs_diff",
                "max_ulp",
                "fraction_differing",
                "histogram",
                "explanation",
                "fix",
            ),
            "evidence": [e.to_json() for e in self.evidence],
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> Verdict:
        return cls(
            **known_fields(cls, found, but=("cause", "confidence", "reseeded", "evidence")),
            reseeded=[SeedingCall.from_json(call) for call in found.get("reseeded") or []],
            cause=Cause(found.get("cause", Cause.UNKNOWN.value)),
            confidence=Confidence(found.get("confidence", Confidence.INFERRED.value)),
            evidence=[Evidence.from_json(item) for item in found.get("evidence") or []],
        )


@dataclass(kw_only=True)
class ReplayInfo(ReadBack):
    performed: bool = False
    from_step: int | None = None
    replayed_steps: int = 0
    faithful: bool | None = None
    """Every replayed step before the divergent one reproduced its own run's records (data order,
    batch, loss, snapshots). The divergent step itself may not, when its cause is entropy."""
    parted: list[Parted] = field(default_factory=list)
    """Where each replica first parted from its own records."""
    seconds: float = 0.0
    commands: list[str] = field(default_factory=list)
    """What was run to replay each run."""
    processes: int = 0
    """How many processes compare started to replay (a distributed run's launcher counting as one,
    fork servers and their copies each as one)."""
    forked: int = 0
    """How many of them were forked from a fork server (no interpreter start, no imports): see
    :mod:`bisect_repro.replay.forks`."""

    def to_json(self) -> dict[str, Any]:
        return {
            **plain_fields(self, "performed", "from_step", "replayed_steps", "faithful"),
            "parted": [p.to_json() for p in self.parted],
            **plain_fields(self, "seconds", "commands", "processes", "forked"),
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> ReplayInfo:
        parted = [Parted(**known_fields(Parted, p)) for p in found.get("parted") or []]
        return cls(**known_fields(cls, found, but=("parted",)), parted=parted)


@dataclass(kw_only=True)
class TimelineRow(ReadBack):
    step: int
    equal: bool
    differing_tensors: int
    first_tensor: str | None
    streams: list[str]
    """Random streams in different states at this snapshot."""
    layers: dict[str, int] = field(default_factory=dict)
    """Differing tensors per layer (the module that owns them; ``optimizer`` state counts with its
    parameter's layer)."""

    def to_json(self) -> dict[str, Any]:
        return plain_fields(
            self, "step", "equal", "differing_tensors", "first_tensor", "streams", "layers"
        )


@dataclass(kw_only=True)
class RankResult:
    """One rank of two runs compared: where its records part (``None``: they do not), and its
    timeline."""

    rank: int
    verdict: Verdict | None = None
    timeline: list[TimelineRow] = field(default_factory=list)
    role: str | None = None
    """``origin`` (its own state differed first) or ``receiver`` (only after a collective); ``None``
    when it agrees."""
    node: int | None = None
    """The node the rank ran on in run A (torchrun's ``GROUP_RANK``), where recorded."""

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "role": self.role,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "timeline": [r.to_json() for r in self.timeline],
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> RankResult:
        verdict = found.get("verdict")
        return cls(
            rank=found["rank"],
            role=found.get("role"),
            node=found.get("node"),
            verdict=Verdict.from_json(verdict) if verdict else None,
            timeline=[TimelineRow.from_json(row) for row in found.get("timeline") or []],
        )


@dataclass(kw_only=True)
class CompareResult:
    runs: list[str]
    identical: bool = False
    verdict: Verdict | None = None
    differences: Differences = field(default_factory=Differences)
    """What differs in how the runs were set up: config, environment, code and settings (JSON:
    ``config_diff``, ``environment_diff``, ``code_diff``, ``settings_diff``)."""
    snapshots: dict[str, int | None] = field(
        default_factory=lambda: {"last_equal": None, "first_divergent": None}
    )
    replay: ReplayInfo = field(default_factory=ReplayInfo)
    timeline: list[TimelineRow] = field(default_factory=list)
    first_log_difference: dict[str, int | None] = field(default_factory=dict)
    ops_context: list[OpContext] = field(default_factory=list)
    """The ops around the first divergent op, in run A's order."""
    notes: list[str] = field(default_factory=list)
    ranks: list[RankResult] = field(default_factory=list)
    """Each rank compared (rank 0 alone for single-process runs); the verdict is the earliest of
    theirs."""
    unused_streams: list[str] = field(default_factory=list)
    """Random streams that differ between the runs but that nothing drew from (their state never
    moved in either run): shown as such, never a cause."""
    compile_bisect: CompileBisect | None = None
    """Where one run compiled and the other did not: the compiler stage that changes the divergent
    step."""
    numerics: Numerics | None = None
    """The distance between the runs' weights against the rounding envelope
    (:mod:`bisect_repro.diagnose.numerics.numerics`)."""
    reseeded_steps: list[int] = field(default_factory=list)
    """The steps whose logs, in either run, show a stream reseeded from entropy."""
    resume: Resume | None = None
    """Where one run resumed from the other's state, and what the resume restored
    (:mod:`bisect_repro.diagnose.compare.resume`)."""

    @property
    def config_diff(self) -> dict[str, list[Any]]:
        """The config keys and arguments that differ, ``{key: [a, b]}`` (``differences.config``)."""
        return self.differences.config

    @property
    def environment_diff(self) -> dict[str, list[Any]]:
        """The environment keys that differ, ``{key: [a, b]}`` (``differences.environment``)."""
        return self.differences.environment

    def to_json(self) -> dict[str, Any]:
        differences = self.differences.to_json()
        return {
            "schema": SCHEMA,
            **plain_fields(self, "runs", "identical"),
            "verdict": self.verdict.to_json() if self.verdict else None,
            "config_diff": differences["config_diff"],
            "environment_diff": differences["environment_diff"],
            "snapshots": self.snapshots,
            "replay": self.replay.to_json(),
            "timeline": [row.to_json() for row in self.timeline],
            "first_log_difference": self.first_log_difference,
            "ops_context": [row.to_json() for row in self.ops_context],
            "notes": self.notes,
            "ranks": [rank.to_json() for rank in self.ranks],
            "unused_streams": self.unused_streams,
            "compile_bisect": self.compile_bisect.to_json()
            if self.compile_bisect is not None
            else None,
            "numerics": self.numerics.to_json() if self.numerics else None,
            "code_diff": differences["code_diff"],
            "settings_diff": differences["settings_diff"],
            "reseeded_steps": self.reseeded_steps,
            "resume": self.resume.to_json() if self.resume else None,
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> CompareResult:
        """A ``bisect-repro/compare/2`` object (``compare --json``) read back."""
        verdict, numerics = found.get("verdict"), found.get("numerics")
        return cls(
            **known_fields(
                cls,
                found,
                but=(
                    "differences",
                    "verdict",
                    "replay",
                    "timeline",
                    "ops_context",
                    "ranks",
                    "compile_bisect",
                    "numerics",
                    "resume",
                ),
            ),
            differences=Differences.from_json(found),
            resume=Resume.from_json(found["resume"]) if found.get("resume") else None,
            ops_context=[OpContext.from_json(row) for row in found.get("ops_context") or []],
            numerics=Numerics.from_json(numerics) if numerics else None,
            verdict=Verdict.from_json(verdict) if verdict else None,
            compile_bisect=CompileBisect(**known_fields(CompileBisect, found["compile_bisect"]))
            if found.get("compile_bisect")
            else None,
            replay=ReplayInfo.from_json(found.get("replay") or {}),
            timeline=[TimelineRow.from_json(row) for row in found.get("timeline") or []],
            ranks=[RankResult.from_json(rank) for rank in found.get("ranks") or []],
        )
