"""What a recorder is asked to record: the schedule (:class:`RecordOptions`) and the whole request
(:class:`SessionPlan`), both checked when they are made, before anything is written."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..errors import BisectReproError

if TYPE_CHECKING:  # annotations only: the command line reads the options without torch
    from ..capture.pystate import Scope
    from ..trainee import Trainee
    from .against import Against

__all__ = ["RecordOptions", "SessionPlan"]


@dataclass(kw_only=True)
class RecordOptions:
    """How often a run is snapshotted and checkpointed."""

    steps: int | None = None
    """Total number of steps of the run (``None``: as many as the loop drives)."""
    every: int = 10
    """Snapshot every this many steps (and always at the first and the last step)."""
    checkpoint_every: int | None = 100
    """Full checkpoint every this many steps, and at the first step; ``None``: at the first step
    only."""
    force: bool = False
    """Overwrite an existing run directory."""
    on_error: Literal["raise", "warn"] = "raise"
    """On a write failure, stop training (``raise``) or warn once and stop recording (``warn``)."""
    accumulate: int = 1
    """Micro-batches per step (gradient accumulation): with more than one, ``batches()`` yields a
    list of that many for each step, and the step's batch hash covers them all in order."""

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 0:
            raise BisectReproError(f"--steps {self.steps}: must be 0 or more")
        if self.every < 1:
            raise BisectReproError(f"--every {self.every}: must be at least 1")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise BisectReproError(
                f"--checkpoint-every {self.checkpoint_every}: must be at least 1"
            )
        if self.accumulate < 1:
            raise BisectReproError(f"accumulate {self.accumulate}: must be at least 1")
        if self.on_error not in ("raise", "warn"):
            raise BisectReproError(f"--on-error {self.on_error}: must be 'raise' or 'warn'")


@dataclass(kw_only=True)
class SessionPlan:
    """What a :class:`~bisect_repro.record.recorder.Recorder` was asked to record."""

    out: Path | str
    """The run directory."""
    trainee: Trainee
    """What trains: the model, the optimizer, the data and the extra state."""
    options: RecordOptions | None = None
    """The schedule (``None``: the defaults, or with ``resume`` the run's own)."""
    target: str | None = None
    """The recipe recorded (``module:function`` or ``file.py:function``), when there is one."""
    config: Mapping[str, Any] | None = None
    """The settings the code was built with, as JSON."""
    resume_from: tuple[Path | str, int] | None = None
    """Start from this run's checkpoint at this step, recording into a new directory."""
    restore_streams: bool = True
    """With ``resume_from``: restore the random streams too."""
    resume: bool = False
    """Continue the interrupted run ``out`` itself from its last checkpoint."""
    max_pending_writes: int = 2
    """Snapshots waiting to be written, at most."""
    framework: bool = False
    """A framework's hooks drive the steps (``begin_step`` ... ``end_step``), not ``batches()``."""
    start_step: int = 0
    """The step the loop starts at (a framework resuming from its own checkpoint)."""
    environment: Mapping[str, Any] = field(default_factory=dict)
    """Settings recorded beside the process's fingerprint (a framework's precision, ...)."""
    auto: bool = False
    """Driven by :class:`~bisect_repro.record.autohooks.AutoHooks` (``record -- python train.py``):
    the run's launch says so, and its replay installs them too."""
    scope: Scope | None = None
    """Where the code that drives the loop keeps its counters, state too
    (:mod:`~bisect_repro.capture.pystate`); ``None``: only a recipe's step function's."""
    against: Against | None = None
    """Check each record against this reference run as it is written, and stop at the first
    difference (:mod:`~bisect_repro.record.against`)."""
