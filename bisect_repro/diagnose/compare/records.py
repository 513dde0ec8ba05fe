"""What two runs' records say on their own, before anything is replayed.

:func:`read_records` lines up two runs: their model structures, configs and environments, the
snapshot timeline (which tensors and streams differ at each common snapshot), and the first step
at which each per-step log (data order, batch content, loss) differs. The last equal snapshot
and the first divergent one bound the divergence; the logs narrow it to a step.

:mod:`bisect_repro.diagnose.compare.from_records` turns them into the verdict from the records
alone.

Distributed runs are compared rank by rank (rank r of one run against rank r of the other, each
with its own environment): :func:`first_divergence` is the first divergence over all ranks: the
earliest step, and at that step the rank where it starts, the one whose own step logs (data order,
batch, loss) or seeding calls show the difference at that step rather than a snapshot after it (a
difference one rank starts reaches the others through the next gradient all-reduce, and their
snapshots); the lowest such rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ...capture.rng import tree_digest
from ...errors import BisectReproError
from ...store.run import Run
from ..selfcheck import seeds_one_of
from .differences import Differences, read_differences
from .resume import Resume, stream_digests
from .settings import settings_difference
from .verdict import TimelineRow, Verdict

__all__ = [
    "Records",
    "first_divergence",
    "layer_of",
    "model_name",
    "rank_zero_alike",
    "read_records",
    "start_at_resume",
]


def layer_of(name: str) -> str | None:
    """The layer (module) a state tensor belongs to: ``0`` for ``0.weight`` and
    ``optimizer.0.weight.exp_avg``."""
    if name.startswith("state."):
        return "state"
    if name.startswith("optimizer."):
        name = name.removeprefix("optimizer.").rpartition(".")[0]
    return name.rpartition(".")[0] or None


def model_name(name: str, run: Run, other: Run) -> str:
    """A tensor's name as the model itself names it, where the two runs' layouts differ: without
    the ``module.`` of a DDP wrapper, so that a run under DDP and one under FSDP2 (which shards the
    model in place, keeping its names) name each parameter alike."""
    return name.removeprefix("module.") if run.layout == "ddp" and other.layout != "ddp" else name


def rank_zero_alike(a: Run, b: Run) -> bool:
    """Whether rank 0 of each run holds the same tensors under the same names, so that their hashes
    compare: the same layout, and the same world size unless every rank holds whole tensors."""
    return a.layout == b.layout and (a.world_size == b.world_size or a.layout in ("ddp", "single"))


@dataclass
class Records:
    """Two runs lined up (see the module docstring)."""

    a: Run
    b: Run
    differences: Differences
    """What differs in how the runs were set up: config, environment, code, settings."""
    structure: str | None = None
    """The first parameter or buffer whose name, shape or dtype differs."""
    run_names: list[str] = field(default_factory=list)
    """Config keys whose values differ only by naming each run's own directory (an output folder):
    they cannot change the numbers, so they are kept out of the config differences and of every
    verdict."""
    timeline: list[TimelineRow] = field(default_factory=list)
    logs: dict[str, int | None] = field(default_factory=dict)
    last_equal: int | None = None
    first_divergent: int | None = None
    resume: Resume | None = None
    """Where one run resumed from the other's state, audited (set by :func:`start_at_resume`)."""

    @property
    def identical(self) -> bool:
        """No snapshot or step log differs, and no resume between the runs missed a part of the
        state."""
        unrestored = self.resume is not None and bool(self.resume.missing)
        return (
            self.first_divergent is None
            and all(v is None for v in self.logs.values())
            and not unrestored
        )

    @property
    def end(self) -> int:
        """The last step that can hold the divergence (``-1``: initialisation, before step 0)."""
        bounds = [s for s in self.logs.values() if s is not None]
        if self.first_divergent is not None:
            bounds.append(self.first_divergent - 1)
        if not bounds and self.resume is not None:
            # only the state a resume started from differs: no later step of both runs shows it
            return self.resume.step
        return min(bounds)

    def streams_at(self, step: int | None) -> list[str]:
        return next((row.streams for row in self.timeline if row.step == step), [])

    def changed_streams(self) -> tuple[list[str], list[str]]:
        """Streams equal at the last equal snapshot and different at the first divergent one; and
        those that already differed at the last equal snapshot but were drawn from since (their
        state moved in either run). A stream that differed all along and did not move was not
        drawn from, so it cannot be the cause."""
        before, after = set(self.streams_at(self.last_equal)), self.streams_at(self.first_divergent)
        moved = self.drawn_between(self.last_equal, self.first_divergent)
        return [s for s in after if s not in before], [
            s for s in after if s in before and s in moved
        ]

    def streams_equal_until(self, streams: list[str], end: int) -> int:
        """The last snapshot at or before ``end`` where none of ``streams`` differ (0 where none):
        where a reseed that parted them can start. A snapshot whose tensors are all equal can
        already hold streams in other states (reseeded after the step before it)."""
        equal = [
            row.step
            for row in self.timeline
            if row.step <= end and not any(name in row.streams for name in streams)
        ]
        return equal[-1] if equal else 0

    def reseeds(
        self, start: int, end: int, streams: list[str] | None = None
    ) -> list[tuple[int, dict[str, Any]]]:
        """Seeding calls from entropy the step logs of either run show in ``[start, end]``, by step
        (only those that seed one of ``streams``, when given)."""
        found = {}
        # bounded by the logs
        logged = sorted(
            {step for run in (self.a, self.b) for step in run.steps if start <= step <= end}
        )
        for step in logged:
            for run in (self.a, self.b):
                for call in run.steps.get(step, {}).get("seeded") or []:
                    if (
                        isinstance(call, dict)
                        and isinstance(call.get("call"), str)
                        and (streams is None or seeds_one_of(call, streams))
                    ):
                        found[(step, call["call"], call.get("where"))] = (
                            step,
                            {k: v for k, v in call.items() if k != "value"},
                        )
        return list(found.values())

    def unused_streams(self) -> list[str]:
        """Streams that differ at some snapshot but whose state never moved, in either run, from
        the first snapshot compared to the last: nothing drew from them, so they cannot be a
        cause."""
        if not self.timeline:
            return []
        differing = dict.fromkeys(s for row in self.timeline for s in row.streams)
        moved = self.drawn_between(self.timeline[0].step, self.timeline[-1].step)
        return [s for s in differing if s not in moved]

    def reseeded_steps(self) -> list[int]:
        """The steps whose logs, in either run, show a stream reseeded from entropy."""
        last = max([*self.a.steps, *self.b.steps], default=0)
        return sorted({step for step, _ in self.reseeds(0, last)})

    def unordered_batch(self, end: int) -> int | None:
        """The step whose batch differs first, at or before ``end``, where no sample indices were
        recorded for it (order or content: not told apart)."""
        step = self.logs.get("batch")
        if step is None or step > end or self.a.steps.get(step, {}).get("order") is not None:
            return None
        return step

    def resumed_at(self) -> tuple[str, int] | None:
        """Which run started from a later step than the other (a resume), and that step."""
        a, b = self.a.meta.options, self.b.meta.options
        if a.start_step == b.start_step and b.resumed_from is None:
            return None
        return ("B", b.start_step) if b.start_step >= a.start_step else ("A", a.start_step)

    def drawn_between(self, start: int | None, end: int | None) -> set[str]:
        """Streams whose state changed between two snapshots of either run."""
        if start is None or end is None:
            return set()
        moved: set[str] = set()
        for run in (self.a, self.b):
            if start in run.snapshots and end in run.snapshots:
                first, last = run.snapshot(start)["streams"], run.snapshot(end)["streams"]
                moved |= {
                    n for n in first if n in last and tree_digest(first[n]) != tree_digest(last[n])
                }
        return moved


def _structure_difference(a: Run, b: Run) -> str | None:
    for kind in ("parameters", "buffers"):
        ta = {model_name(n, a, b): v for n, v in a.meta.model.get(kind, {}).items()}
        tb = {model_name(n, b, a): v for n, v in b.meta.model.get(kind, {}).items()}
        for name in dict.fromkeys([*ta, *tb]):
            if ta.get(name) != tb.get(name):
                return name
    return None


def _timeline(a: Run, b: Run) -> tuple[list[TimelineRow], list[tuple[int, Any, Any]]]:
    """The timeline of the snapshots both runs hold, and each one's settings in both (read once)."""
    rows, settings = [], []
    for step in sorted(set(a.snapshots) & set(b.snapshots)):
        sa, sb = a.snapshot(step), b.snapshot(step)
        settings.append(
            (step, _with_loader(sa.get("settings"), a), _with_loader(sb.get("settings"), b))
        )
        differing = [
            n
            for n in dict.fromkeys([*sa["hashes"], *sb["hashes"]])
            if sa["hashes"].get(n) != sb["hashes"].get(n)
        ]
        da, db = stream_digests(a, b, step, (sa, sb)) or ({}, {})
        streams = sorted(n for n in set(da) & set(db) if da[n] != db[n])
        layers: dict[str, int] = {}
        for name in differing:
            layer = layer_of(name) or "(model)"
            layers[layer] = layers.get(layer, 0) + 1
        rows.append(
            TimelineRow(
                step=step,
                equal=not differing,
                differing_tensors=len(differing),
                first_tensor=next(iter(differing), None),
                streams=streams,
                layers=layers,
            )
        )
    return rows, settings


def _with_loader(settings: Any, run: Run) -> Any:
    """A snapshot's settings with the run's loader settings (batch size, workers, ...), which do not
    change."""
    if not isinstance(settings, dict):
        return settings
    loader = {
        f"loader.{k}": v
        for k, v in run.meta.loader.items()
        if v is None or type(v) in (bool, int, float, str)
    }
    return {**loader, **settings}


def _first_log_differences(a: Run, b: Run) -> dict[str, int | None]:
    """The first step at which each logged field differs; ``first_batch``: the step's first noted
    batch (its only one where it noted one), which tells a step whose first forward read the same
    batch in both runs from one whose data differs from its start."""
    found: dict[str, int | None] = {"order": None, "batch": None, "loss": None, "first_batch": None}
    for step in sorted(set(a.steps) & set(b.steps)):
        ra, rb = a.steps[step], b.steps[step]
        for key in found:
            if found[key] is None and _logged(ra, key) != _logged(rb, key):
                found[key] = step
    return found


def _logged(record: dict[str, Any], key: str) -> Any:
    if key == "first_batch":
        return record.get("first", record.get("batch"))
    return record.get(key)


def read_records(a: Run, b: Run) -> Records:
    differences, run_names = read_differences(a, b)
    records = Records(
        a, b, differences=differences, structure=_structure_difference(a, b), run_names=run_names
    )
    if records.structure is not None:
        return records
    records.timeline, settings = _timeline(a, b)
    records.differences = replace(
        differences, settings=settings_difference(settings, differences.config)
    )
    if not records.timeline:
        raise BisectReproError(
            f"{b.path}: has no snapshot at a step that {a.path} has; the runs cannot be compared"
        )
    records.logs = _first_log_differences(a, b)
    divergent = next((row for row in records.timeline if not row.equal), None)
    equal = [
        row
        for row in records.timeline
        if row.equal and (divergent is None or row.step < divergent.step)
    ]
    records.last_equal = equal[-1].step if equal else None
    records.first_divergent = divergent.step if divergent else None
    return records


def start_at_resume(records: Records, resume: Resume) -> None:
    """Both runs start from the resume step when the resumed run holds the other's model there
    (:mod:`~bisect_repro.diagnose.compare.resume`): the replay steps both from it, and a part the
    resume did not restore (an optimizer's state) shows in the step that uses it, not as another
    initial state; the records keep the audit (``records.resume``). Called before the records'
    verdict is made."""
    records.resume = resume
    first = records.timeline[0] if records.timeline else None
    if first is None or first.step != resume.step or first.equal:
        return
    records.last_equal = resume.step
    divergent = next((row for row in records.timeline[1:] if not row.equal), None)
    records.first_divergent = divergent.step if divergent is not None else None


def _shows_itself_at(records: Records, step: int) -> bool:
    """Whether the rank's own step logs or seeding calls differ at ``step`` (not only a snapshot
    after it)."""
    return step in records.logs.values() or bool(records.reseeds(step, step))


def first_divergence(ranks: list[tuple[Records, Verdict | None]]) -> tuple[Records, Verdict] | None:
    """The rank where the runs first part, with its verdict (see the module docstring); ``None``
    when no rank does."""
    parted = [(records, verdict) for records, verdict in ranks if verdict is not None]
    if not parted:
        return None
    return min(
        parted,
        key=lambda item: (
            item[1].step,
            not _shows_itself_at(item[0], item[1].step),
            item[0].a.rank,
        ),
    )
