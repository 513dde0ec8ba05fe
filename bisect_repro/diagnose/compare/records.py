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

from ...capture import env
from ...capture.rng import tree_digest
from ...errors import BisectReproError
from ...record.arguments import argv_flags
from ...store.meta import CodeKind
from ...store.run import Run
from ..causes import Cause, cause_title
from ..selfcheck import seeds_one_of
from .resume import Resume
from .settings import SettingsDifference, settings_difference
from .verdict import TimelineRow, Verdict

__all__ = [
    "Records",
    "first_divergence",
    "layer_of",
    "model_name",
    "rank_zero_alike",
    "read_records",
    "start_at_resume",
    "through_collectives",
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
    config_diff: dict[str, list[Any]]
    environment_diff: dict[str, list[Any]]
    structure: str | None = None
    """The first parameter or buffer whose name, shape or dtype differs."""
    run_names: list[str] = field(default_factory=list)
    """Config keys whose values differ only by naming each run's own directory (an output folder):
    they cannot change the numbers, so they are kept out of ``config_diff`` and of every verdict."""
    timeline: list[TimelineRow] = field(default_factory=list)
    logs: dict[str, int | None] = field(default_factory=dict)
    last_equal: int | None = None
    first_divergent: int | None = None
    settings: SettingsDifference | None = None
    """The first snapshot where the optimizer's or the scheduler's non-tensor state differs."""

    @property
    def identical(self) -> bool:
        return self.first_divergent is None and all(v is None for v in self.logs.values())

    @property
    def end(self) -> int:
        """The last step that can hold the divergence (``-1``: initialisation, before step 0)."""
        bounds = [s for s in self.logs.values() if s is not None]
        if self.first_divergent is not None:
            bounds.append(self.first_divergent - 1)
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
        streams = sorted(
            n
            for n in set(sa["streams"]) & set(sb["streams"])
            if tree_digest(sa["streams"][n]) != tree_digest(sb["streams"][n])
        )
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
    found: dict[str, int | None] = {"order": None, "batch": None, "loss": None}
    for step in sorted(set(a.steps) & set(b.steps)):
        for key in found:
            if found[key] is None and a.steps[step].get(key) != b.steps[step].get(key):
                found[key] = step
    return found


def _names_its_run(value: Any, run: Run) -> Any:
    """``value`` with each path component that is the run directory's own name replaced by one
    placeholder: ``runs/a/logs`` of run ``a`` and ``runs/b/logs`` of run ``b`` then read alike."""
    if not isinstance(value, str):
        return value
    return "/".join("\0run" if part == run.path.name else part for part in value.split("/"))


def run_config(run: Run) -> dict[str, Any]:
    """A run's config as compared: a script's also holds its command line flag by flag, unless
    its parsed arguments (keys ``--name``) are recorded, which say more (defaults, aliases)."""
    config, launch = run.meta.config, run.meta.launch
    if (
        launch is None
        or launch.code is None
        or launch.code.kind is CodeKind.RECIPE
        or any(k.startswith("-") for k in config)
    ):
        return config
    return {**argv_flags(launch.argv), **config}


def read_records(a: Run, b: Run) -> Records:
    config_a, config_b = run_config(a), run_config(b)
    differ = [
        k for k in dict.fromkeys([*config_a, *config_b]) if config_a.get(k) != config_b.get(k)
    ]
    run_names = [
        k
        for k in differ
        if _names_its_run(config_a.get(k), a) == _names_its_run(config_b.get(k), b)
    ]
    records = Records(
        a,
        b,
        config_diff={k: [config_a.get(k), config_b.get(k)] for k in differ if k not in run_names},
        environment_diff=env.diff(a.environment, b.environment),
        structure=_structure_difference(a, b),
        run_names=run_names,
    )
    if records.structure is not None:
        return records
    records.timeline, settings = _timeline(a, b)
    records.settings = settings_difference(settings, records.config_diff)
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


def through_collectives(
    verdict: Verdict | None, first: Verdict, *, receiver: bool = False
) -> Verdict | None:
    """A rank's verdict when its own records explain nothing, or it is a ``receiver`` (its state
    differed only after another rank's log did), and the ``first`` rank's records name a cause at
    or before its step: that cause, inferred to have reached this rank through the collectives
    (DDP's all-reduce carries one rank's difference to every rank in the same step)."""
    own = verdict is not None and verdict.cause is not Cause.UNKNOWN and not receiver
    if verdict is None or own or first.cause is Cause.UNKNOWN or verdict.rank == first.rank:
        return verdict
    if first.step > verdict.step:
        return verdict
    return replace(
        verdict,
        cause=first.cause,
        rng=list(first.rng),
        config_keys=list(first.config_keys),
        environment_keys=list(first.environment_keys),
        explanation=(
            f"{verdict.explanation}; rank {first.rank} parted first, at step {first.step} "
            f"({cause_title(first.cause)}), "
            "and the collectives carry a rank's difference to the others, so this rank is "
            "inferred to follow it"
        ),
        fix=first.fix,
    )


def start_at_resume(records: Records, resume: Resume) -> None:
    """Both runs start from the resume step when the resumed run holds the other's model there:
    the replay steps both from it, and a part the resume did not restore (an optimizer's state)
    shows in the step that uses it, not as another initial state."""
    first = records.timeline[0] if records.timeline else None
    if first is None or first.step != resume.step or first.equal:
        return
    records.last_equal = resume.step
    divergent = next((row for row in records.timeline[1:] if not row.equal), None)
    records.first_divergent = divergent.step if divergent is not None else None
