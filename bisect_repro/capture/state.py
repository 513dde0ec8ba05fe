"""A trainee's whole state, as one stateful object: model, optimizer, scheduler, data, streams.

Two views of the same state:
- :meth:`TrainingState.tensors`: every parameter, buffer and optimizer-state tensor by a stable
  name, for hashing (``encoder.embed.table``, ``optimizer.encoder.embed.table.exp_avg``);
- :meth:`TrainingState.state_dict`: everything needed to resume training exactly, for
  checkpoints, including the trainee's own ``state`` objects (a counter, a curriculum) and the
  counters its code keeps in module globals and closures (:mod:`~bisect_repro.capture.pystate`);
  :meth:`TrainingState.extra_digests` gives the digests of the ``state`` objects for snapshots.

The random streams are the global ones, the loader's generators, the trainee's ``generators`` and
the generators held inside the dataset and samplers
(:func:`~bisect_repro.capture.hidden.recipe_streams`: an augmentation's ``self.rng``), so that a
snapshot holds every stream the data draws from.

:meth:`TrainingState.load_state_dict` restores in the one order that is exact: tensors, then the
data position (whose fast-forward draws from the streams), then the streams of the resumed step.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from ..trainee import Trainee, optimizer_prefix
from .data import DataStream
from .hidden import recipe_streams
from .parallel import (
    distribute_like,
    distribute_optimizer_state,
    local,
    localize,
    locals_and_placements,
    model_placements,
    placements,
)
from .pystate import PythonState, Scope
from .rng import RandomStreams, tree_digest

__all__ = ["TrainingState", "model_structure"]


def model_structure(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Parameter and buffer names with their (global) shapes and dtypes; for DTensors, also their
    placements and meshes (``dtensors`` and ``meshes``, see :func:`parallel.model_placements`)."""

    def describe(tensor: torch.Tensor) -> list[Any]:
        return [list(tensor.shape), str(tensor.dtype).removeprefix("torch.")]

    return {
        "parameters": {name: describe(p) for name, p in model.named_parameters()},
        "buffers": {name: describe(b) for name, b in model.named_buffers()},
        **model_placements(model),
    }


def parameter_names(model: torch.nn.Module, *optimizers: torch.optim.Optimizer) -> dict[int, str]:
    """``id(param)`` to its model name, for every parameter the optimizers hold."""
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    found: dict[int, str] = {}
    for o, optimizer in enumerate(optimizers):
        for g, group in enumerate(optimizer.param_groups):
            for i, param in enumerate(group["params"]):
                found[id(param)] = names.get(id(param), f"{optimizer_prefix(o)}.group{g}.param{i}")
    return found


_SKIP = object()


def _plain(value: Any, depth: int = 2) -> Any:
    """``value`` as plain JSON (a dict's keys as text), or ``_SKIP`` when it is not plain data."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if depth and isinstance(value, (list, tuple)) and len(value) <= 64:
        items = [_plain(v, depth - 1) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    if depth and isinstance(value, dict) and len(value) <= 64:
        mapped = {str(k): _plain(v, depth - 1) for k, v in value.items()}
        return _SKIP if any(v is _SKIP for v in mapped.values()) else mapped
    return _SKIP


class TrainingState:
    """The stateful whole of a :class:`Trainee`; ``scope``: where the code that drives it keeps its
    counters (the step function's own module and closure, when it has a step function)."""

    def __init__(self, trainee: Trainee, scope: Scope | None = None) -> None:
        self.trainee = trainee
        self.streams = RandomStreams(recipe_streams(trainee))
        step = trainee.step
        if isinstance(step, types.FunctionType) and not str(step.__module__).startswith(
            __name__.split(".")[0] + "."
        ):
            # a recipe's own step function: its module and closure
            scope = Scope(step.__globals__, (step,))
        self.python = PythonState(scope or Scope())
        self.data = DataStream(trainee.source, self.streams)
        self._names = parameter_names(trainee.model, *trainee.optimizers)
        self.extra: dict[str, Any] = dict(trainee.state or {})

    def close(self) -> None:
        self.data.close()

    def _named_tensors(self) -> dict[str, torch.Tensor]:
        model = self.trainee.model
        found: dict[str, torch.Tensor] = dict(model.named_parameters())
        found.update(model.named_buffers())
        for prefix, optimizer in self.trainee.named_optimizers:
            for group in optimizer.param_groups:
                for param in group["params"]:
                    for key, value in optimizer.state.get(param, {}).items():
                        if isinstance(value, torch.Tensor):
                            found[f"{prefix}.{self._names[id(param)]}.{key}"] = value
        return found

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter, buffer and optimizer-state tensor this rank holds (a DTensor's local
        shard)."""
        return {name: local(tensor) for name, tensor in self._named_tensors().items()}

    def parameters(self) -> dict[str, torch.Tensor]:
        """The model's parameters by name, as the model holds them (a DTensor whole, for its global
        indices)."""
        return dict(self.trainee.model.named_parameters())

    def placements(self) -> dict[str, Any]:
        """The placements and meshes of the DTensors among :meth:`tensors` (``{}`` when none)."""
        return placements(self._named_tensors())

    def tensors_and_placements(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """:meth:`tensors` and :meth:`placements` from one walk over the model and optimizer."""
        return locals_and_placements(self._named_tensors())

    def state_dict(self) -> dict[str, Any]:
        scheduler = self.trainee.scheduler
        return {
            "model": localize(self.trainee.model.state_dict()),
            **{
                prefix: localize(optimizer.state_dict())
                for prefix, optimizer in self.trainee.named_optimizers
            },
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "data": self.data.state_dict(),
            "streams": self.streams.state_dict(),
            "extra": {name: value.state_dict() for name, value in self.extra.items()},
            "python": self.python.state_dict(),
        }

    def settings(self) -> dict[str, Any]:
        """The trainee's non-tensor state, flat and JSON-safe, for snapshots: each optimizer group's
        hyperparameters (``optimizer.group0.lr``, ``...betas``, ``...weight_decay``; a second
        optimizer's ``optimizer1.group0.lr``) and the
        scheduler's state (``scheduler.milestones``, ``scheduler.last_epoch``); values JSON cannot
        hold plainly (objects, tensors) are left out."""
        found: dict[str, Any] = {}
        for prefix, optimizer in self.trainee.named_optimizers:
            for index, group in enumerate(optimizer.param_groups):
                for key, value in group.items():
                    if key != "params" and (plain := _plain(value)) is not _SKIP:
                        found[f"{prefix}.group{index}.{key}"] = plain
        scheduler = self.trainee.scheduler
        for key, value in (scheduler.state_dict() if scheduler is not None else {}).items():
            if not key.startswith("_") and (plain := _plain(value)) is not _SKIP:
                found[f"scheduler.{key}"] = plain
        return found

    def extra_digests(self) -> dict[str, str]:
        """A digest of each ``Trainee.state`` object's state, by ``state.<name>``."""
        return {
            f"state.{name}": tree_digest(value.state_dict()) for name, value in self.extra.items()
        }

    def load_state_dict(
        self, state: dict[str, Any], *, streams: bool = True, python: bool = True
    ) -> None:
        """Restore a checkpoint; ``streams=False`` leaves the random streams as they are,
        ``python=False`` the code's counters. Local shards are made DTensors again where the model
        holds DTensors."""
        model = self.trainee.model
        model.load_state_dict(distribute_like(state["model"], model.state_dict()))
        for prefix, optimizer in self.trainee.named_optimizers:
            # a checkpoint holds every optimizer the trainee had when it was saved
            if prefix in state:
                optimizer.load_state_dict(distribute_optimizer_state(state[prefix], optimizer))
        if self.trainee.scheduler is not None and state.get("scheduler") is not None:
            self.trainee.scheduler.load_state_dict(state["scheduler"])
        for name, value in (state.get("extra") or {}).items():
            if name in self.extra:
                self.extra[name].load_state_dict(value)
        if python:
            self.python.load_state_dict(state.get("python"))
        current = self.streams.state_dict()
        self.data.load_state_dict(state["data"])
        self.streams.load_state_dict(state["streams"] if streams else current)
