"""A resumed run against the run it resumed: the runs lined up by the states they pass through, and
what the resume restored.

A script that resumes from its own checkpoint counts its steps from 0 again; compared by step
number, every resumed run would read as a different initialisation. :func:`align` lines two runs
up by content instead: where one run's first snapshot holds the same model (parameters and
buffers, by hash) as a later snapshot of the other, the first run is seen at the other's steps
(:meth:`~bisect_repro.store.run.Run.shifted`): its step ``s`` is the other's ``s + offset``, so
every step printed is the uninterrupted run's. A run resumed from a checkpoint of a third run, or
resumed several times, is placed the same way, by the state it starts from.

:func:`audit` says, at the step where the run resumed, which parts of the training state the
resume restored and which it did not, each with both runs' digests: the model, each optimizer's
state and settings, the recipe's other state (a scheduler, a scaler, an EMA copy), each random
stream (as the step's first batch is noted: a script's snapshot at its first step is taken at its
model's first forward, after that step drew its input, and the uninterrupted run's as the step
began), and the data position (the sample order and the batch of the step).

Where the guarantees stop: a run is placed only at a step where the other has a snapshot (a
resume between two snapshots is not placed, and is compared from its start as before); where
several snapshots of the other run hold the same model (a run that did not train), the earliest
is taken and :attr:`Resume.note` says so; runs with start steps of their own (a framework's
resume, the Recorder's) and distributed runs are not moved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...capture.rng import tree_digest
from ...store.run import Run

__all__ = [
    "NO_RESUME",
    "Resume",
    "ResumePart",
    "align",
    "audit",
    "first_states_differ",
    "model_hashes",
    "stream_digests",
]

_OPTIMIZER = re.compile(r"^(optimizer\d*)\.")


def model_hashes(hashes: dict[str, str]) -> dict[str, str]:
    """The model's own tensors of a snapshot's hashes: not an optimizer's state, nor the recipe's
    other state."""
    return {
        name: digest
        for name, digest in hashes.items()
        if not _OPTIMIZER.match(name) and not name.startswith("state.")
    }


@dataclass(frozen=True, kw_only=True)
class ResumePart:
    """One part of the training state at the resume, in both runs."""

    part: str
    """``model``, ``optimizer`` (``optimizer1``, ...), ``optimizer settings``, ``state.NAME``,
    ``stream NAME``, ``data order`` or ``batch``."""
    restored: bool
    """The resumed run holds what the other held there."""
    a: str | None
    b: str | None
    """Each run's digest of it (``None``: the run holds none)."""

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "restored": self.restored, "a": self.a, "b": self.b}


@dataclass(frozen=True, kw_only=True)
class Resume:
    """Where one run resumed from the other's state (see the module docstring)."""

    run: str
    """The run that resumed: ``A`` or ``B``."""
    step: int
    """The other run's step it resumed at (where its first snapshot is placed)."""
    offset: int
    """How far its steps were moved: its step ``s`` is shown as ``s + offset``."""
    note: str | None = None
    parts: list[ResumePart] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        """The parts the resume did not restore."""
        return [part.part for part in self.parts if not part.restored]

    @property
    def state_missing(self) -> list[str]:
        """The parts of the training state the resume did not restore, less the streams and the
        data (their own causes name them): each optimizer's state and settings, the recipe's
        other state."""
        return [
            part
            for part in self.missing
            if part.startswith("optimizer") or part.startswith("state.")
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            "offset": self.offset,
            "note": self.note,
            "restored": [p.part for p in self.parts if p.restored],
            "missing": self.missing,
            "parts": [p.to_json() for p in self.parts],
        }

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> Resume:
        """A ``resume`` object of ``compare --json``, read back."""
        parts = [
            ResumePart(
                part=str(p["part"]), restored=bool(p["restored"]), a=p.get("a"), b=p.get("b")
            )
            for p in found.get("parts") or []
        ]
        return cls(
            run=str(found["run"]),
            step=int(found["step"]),
            offset=int(found["offset"]),
            note=found.get("note"),
            parts=parts,
        )

    def sentence(self) -> str:
        """One line: where the run resumed, and what it did not restore."""
        where = f"run {self.run} resumed at step {self.step} of run {_other(self.run)}"
        if not self.missing:
            return f"{where}, with every recorded part of the training state restored"
        return f"{where}; the resume did not restore: {', '.join(self.missing)}"


def _other(label: str) -> str:
    return "B" if label == "A" else "A"


def _first_model(run: Run) -> dict[str, str]:
    return model_hashes(run.snapshot(min(run.snapshots))["hashes"])


def first_states_differ(a: Run, b: Run) -> bool:
    """Whether the runs' first snapshots hold other models."""
    return bool(a.snapshots and b.snapshots) and _first_model(a) != _first_model(b)


def _placed(later: Run, earlier: Run) -> tuple[int, list[int]] | None:
    """Where ``later``'s first snapshot holds the model of a snapshot of ``earlier`` after
    ``earlier``'s first: that step, with every step that holds it."""
    start = _first_model(later)
    first = min(earlier.snapshots)
    if not start or start == _first_model(earlier):
        return None
    steps = [
        step
        for step in sorted(earlier.snapshots)
        if step > first and model_hashes(earlier.snapshot(step)["hashes"]) == start
    ]
    return (steps[0], steps) if steps else None


NO_RESUME = (
    "the runs' first states differ and neither equals a later state of the other: no resume point "
    "was found, and the runs are compared from their first steps"
)


def align(a: Run, b: Run) -> tuple[Run, Run, Resume | None]:
    """The two runs, the one that resumed from the other's state seen at the other's steps, and
    where it resumed (``None``: neither did, and the runs are as given)."""
    if (
        a.distributed
        or b.distributed
        or a.meta.options.start_step
        or b.meta.options.start_step
        or not a.snapshots
        or not b.snapshots
    ):
        return a, b, None
    for label, later, earlier in (("B", b, a), ("A", a, b)):
        placed = _placed(later, earlier)
        if placed is None:
            continue
        step, steps = placed
        offset = step - min(later.snapshots)
        note = (
            f"run {label}'s first state equals run {_other(label)}'s at steps "
            f"{', '.join(map(str, steps))} (a run that did not train between them): the earliest "
            "is taken"
            if len(steps) > 1
            else None
        )
        moved = later.shifted(offset)
        resume = Resume(run=label, step=step, offset=offset, note=note)
        return (a, moved, resume) if label == "B" else (moved, b, resume)
    return a, b, None


def _drawn(run: Run) -> set[str]:
    """The streams a run drew from: their state moved between its first and last snapshots."""
    first, last = (
        run.snapshot(step)["streams"] for step in (min(run.snapshots), max(run.snapshots))
    )
    return {n for n in first if n in last and tree_digest(first[n]) != tree_digest(last[n])}


def audit(a: Run, b: Run, resume: Resume) -> Resume:
    """``resume`` with the parts of the state at its step, each restored or not (both runs seen at
    the same steps, as :func:`align` returns them). Streams that neither run drew from cannot
    matter and are left out; the data of the step is audited where both runs logged it."""
    step = resume.step
    sa, sb = a.snapshot(step), b.snapshot(step)
    parts = [*_tensor_parts(sa["hashes"], sb["hashes"]), *_settings(sa, sb)]
    drawn = _drawn(a) | _drawn(b)
    digests = stream_digests(a, b, step, (sa, sb))
    streams_a, streams_b = digests if digests is not None else ({}, {})
    for name in sorted((set(streams_a) | set(streams_b)) & drawn):
        da, db = streams_a.get(name), streams_b.get(name)
        parts.append(ResumePart(part=f"stream {name}", restored=da == db, a=da, b=db))
    notes = [resume.note] if resume.note else []
    if step in a.steps and step in b.steps:
        for key, part in (("order", "data order"), ("batch", "batch")):
            da, db = (run.steps[step].get(key) for run in (a, b))
            if da is not None or db is not None:
                parts.append(ResumePart(part=part, restored=da == db, a=da, b=db))
    else:
        ended = "A" if step not in a.steps else "B"
        notes.append(
            f"the data position is not audited: run {ended} ended before its step {step} drew "
            "a batch"
        )
    if digests is None:
        notes.append(
            "the random streams are not audited: the resumed script's were taken only after its "
            "first step drew its data, and the other run holds none at that point"
        )
    note = "; ".join(notes) or None
    return Resume(run=resume.run, step=step, offset=resume.offset, note=note, parts=parts)


def stream_digests(
    a: Run, b: Run, step: int, trees: tuple[Mapping[str, Any], Mapping[str, Any]]
) -> tuple[dict[str, str], dict[str, str]] | None:
    """Each stream's digest at ``step`` in both runs (``trees``: their snapshots there), taken at
    the same point of the step, or ``None`` where the records hold none.

    A run moved to the other's steps (a resumed script) starts at ``step``, and its snapshot there
    was taken at its model's first forward, after the step drew its input; the other's as the step
    began. So there, the streams as the step's first batch was noted are compared where both runs'
    step records hold them, else the resumed script's streams from before its first step drew its
    data (its first loader iterator) against the other's snapshot; a resumed script with neither
    (no loader) is not compared (``None``). Everywhere else, the snapshots' streams."""
    starts = {min(run.snapshots) for run in (a, b) if run.offset and run.snapshots}
    if step not in starts:
        return _snapshot_streams(trees[0]), _snapshot_streams(trees[1])
    noted = [run.steps.get(step, {}).get("streams") for run in (a, b)]
    if noted[0] and noted[1]:
        return dict(noted[0]), dict(noted[1])
    found = []
    for run, tree in zip((a, b), trees, strict=True):
        if not run.offset or min(run.snapshots) != step:
            found.append(_snapshot_streams(tree))
        elif run.steps.get(step, {}).get("start"):
            found.append(dict(run.steps[step]["start"]))
        elif run.meta.launch is not None and run.meta.launch.auto:
            return None
        else:
            found.append(_snapshot_streams(tree))
    return found[0], found[1]


def _snapshot_streams(tree: Mapping[str, Any]) -> dict[str, str]:
    return {name: tree_digest(state) for name, state in tree["streams"].items()}


def _tensor_parts(ha: dict[str, str], hb: dict[str, str]) -> list[ResumePart]:
    """The model, each optimizer's state and each other state, each as one digest."""
    groups: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for hashes, side in ((ha, 0), (hb, 1)):
        for name, digest in hashes.items():
            match = _OPTIMIZER.match(name)
            group = (
                match.group(1)
                if match
                else ".".join(name.split(".")[:2])
                if name.startswith("state.")
                else "model"
            )
            groups.setdefault(group, ({}, {}))[side][name] = digest
    parts = []
    for group in sorted(groups, key=lambda g: (g != "model", g)):
        ga, gb = groups[group]
        da = tree_digest(dict(sorted(ga.items()))) if ga else None
        db = tree_digest(dict(sorted(gb.items()))) if gb else None
        parts.append(ResumePart(part=group, restored=ga == gb, a=da, b=db))
    return parts


def _settings(sa: dict[str, Any], sb: dict[str, Any]) -> list[ResumePart]:
    """The optimizers' settings (learning rates, ...), where the snapshots hold them."""
    settings_a, settings_b = sa.get("settings"), sb.get("settings")
    if not isinstance(settings_a, dict) or not isinstance(settings_b, dict):
        return []
    da, db = tree_digest(settings_a), tree_digest(settings_b)
    return [ResumePart(part="optimizer settings", restored=da == db, a=da, b=db)]
