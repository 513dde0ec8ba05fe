"""A step's start, kept in memory so that the step can run again, and a rebuilt trainee's settings.

:class:`KeptStart` holds everything a step starts from: the batch, copies of the model's and the
optimizer's state, the scheduler's, the gradients, the extra state, the random streams after the
batch was fetched and before, and the data position. :func:`keep_start` takes it, and
:func:`load_start` puts the trainee back into it, so that the step runs again from the same state.

:func:`hyperparameters` and :func:`overlay_hyperparameters` serve the config experiment: run B
rebuilt with A's config restores B's checkpoint, whose optimizer groups and scheduler settings
(milestones) would undo the config; the built settings are laid back over the restored state,
its progress (the scheduler's step count, the moved learning rate) kept.

Where the guarantees stop: what is kept is the state the :class:`~bisect_repro.trainee.Trainee`
holds and the counters its code keeps in module globals and closures
(:mod:`~bisect_repro.capture.pystate`); a local variable of the running loop (an ``enumerate``
counter) is not (the controller detects a step that reads one: it runs other ops from the same
state).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ..capture.state import TrainingState
from ..trainee import Trainee

__all__ = [
    "BuiltSettings",
    "KeptStart",
    "hyperparameters",
    "keep_start",
    "load_start",
    "overlay_hyperparameters",
]


@dataclass
class KeptStart:
    """Everything a step starts from (see the module docstring)."""

    step: int
    batch: Any
    indices: list[int] | None
    tensors: dict[str, Any]
    streams: dict[str, Any]
    """The streams after the batch was fetched: what the step's own code draws from."""
    pre_streams: dict[str, Any]
    """Before the batch was fetched: what the data drew from."""
    data: dict[str, Any]
    """The data position before the fetch."""


def keep_start(
    state: TrainingState,
    step: int,
    batch: Any,
    indices: list[int] | None,
    pre_streams: dict[str, Any],
    data: dict[str, Any],
) -> KeptStart:
    """Copies of what ``state`` holds now, as the start of ``step`` (its batch just fetched)."""
    trainee = state.trainee
    tensors = {
        "model": {k: v.detach().clone() for k, v in trainee.model.state_dict().items()},
        "optimizers": [copy.deepcopy(optimizer.state_dict()) for optimizer in trainee.optimizers],
        "scheduler": copy.deepcopy(trainee.scheduler.state_dict())
        if trainee.scheduler is not None
        else None,
        "grads": [
            p.grad.detach().clone() if p.grad is not None else None
            for p in trainee.model.parameters()
        ],
        "extra": {name: copy.deepcopy(value.state_dict()) for name, value in state.extra.items()},
        "python": state.python.state_dict(),
    }
    return KeptStart(step, batch, indices, tensors, state.streams.state_dict(), pre_streams, data)


def load_start(state: TrainingState, start: KeptStart, streams: dict[str, Any] | None) -> None:
    """Put the trainee back at ``start`` (under ``streams`` instead of its own, when given)."""
    trainee, saved = state.trainee, start.tensors
    trainee.model.load_state_dict(saved["model"])
    for optimizer, kept in zip(trainee.optimizers, saved["optimizers"], strict=True):
        optimizer.load_state_dict(copy.deepcopy(kept))
    if trainee.scheduler is not None:
        trainee.scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
    for parameter, grad in zip(trainee.model.parameters(), saved["grads"], strict=True):
        parameter.grad = grad.clone() if grad is not None else None
    for name, value in saved["extra"].items():
        state.extra[name].load_state_dict(copy.deepcopy(value))
    state.python.load_state_dict(saved["python"])
    state.streams.load_state_dict(streams if streams is not None else start.streams)


_PROGRESS = frozenset(
    {
        "last_epoch",
        "_step_count",
        "_last_lr",
        "_get_lr_called_within_step",
        "_is_initial",
        "base_lrs",
    }
)
"""A scheduler's state that moves as training goes (restored from the checkpoint); the rest of its
state (milestones, gamma, step size, the schedule's length) is how it was built."""


@dataclass(frozen=True)
class BuiltSettings:
    """How a trainee was built, beside its tensors: the optimizer's groups (without their
    parameters), the scheduler's initial rates and its other settings."""

    groups: list[dict[str, Any]]
    base_lrs: list[Any] | None
    scheduler: dict[str, Any]


def _groups(trainee: Trainee) -> list[dict[str, Any]]:
    """The parameter groups of every optimizer of ``trainee``, the first optimizer's first."""
    return [group for optimizer in trainee.optimizers for group in optimizer.param_groups]


def hyperparameters(trainee: Trainee) -> BuiltSettings:
    """The settings of ``trainee`` as built (see :class:`BuiltSettings`)."""
    groups = [{k: v for k, v in group.items() if k != "params"} for group in _groups(trainee)]
    scheduler = trainee.scheduler
    settings = (
        {k: copy.deepcopy(v) for k, v in scheduler.state_dict().items() if k not in _PROGRESS}
        if scheduler is not None
        else {}
    )
    return BuiltSettings(groups, list(getattr(scheduler, "base_lrs", None) or []) or None, settings)


def overlay_hyperparameters(trainee: Trainee, built: BuiltSettings) -> None:
    """After a checkpoint is restored into a trainee built with another config: keep the
    checkpoint's tensors and position but the built optimizer's hyperparameters (a learning rate
    a scheduler has moved is scaled by the ratio of the two initial rates) and the built
    scheduler's settings (its milestones, its decay)."""
    for group, settings in zip(_groups(trainee), built.groups, strict=False):
        for key, value in settings.items():
            if key == "lr" and group.get("initial_lr") and settings.get("initial_lr"):
                group["lr"] = group["lr"] * settings["initial_lr"] / group["initial_lr"]
            elif key != "lr" or not group.get("initial_lr"):
                group[key] = value
        if "initial_lr" in settings:
            group["initial_lr"] = settings["initial_lr"]
    scheduler = trainee.scheduler
    if scheduler is not None:
        if built.scheduler:
            scheduler.load_state_dict({**scheduler.state_dict(), **built.scheduler})
        if built.base_lrs is not None:
            scheduler.base_lrs = built.base_lrs  # type: ignore[attr-defined]
            scheduler._last_lr = [group["lr"] for group in trainee.optim.param_groups]  # type: ignore[attr-defined]
