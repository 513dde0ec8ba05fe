"""A trainee's whole state, as one stateful object: model, optimizer, scheduler, data, streams.

Two views of the same state:
- :meth:`TrainingState.tensors`: every parameter, buffer and optimizer-state tensor by a stable
  name, for hashing (``encoder.embed.table``, ``optimizer.encoder.embed.table.exp_avg``);
- :meth:`TrainingState.state_dict`: everything needed to resume training exactly, for
  checkpoints.

:meth:`TrainingState.load_state_dict` restores in the one order that is exact: tensors, then the
data position (whose fast-forward draws from the streams), then the streams of the resumed step.
"""

from __future__ import annotations

from typing import Any

import torch

from .data import DataStream, loader_generators
from .recipe import Trainee
from .rng import RandomStreams

__all__ = ["TrainingState", "model_structure"]


def model_structure(model: torch.nn.Module) -> dict[str, dict[str, list[Any]]]:
    """Parameter and buffer names with their shapes and dtypes."""

    def describe(tensor: torch.Tensor) -> list[Any]:
        return [list(tensor.shape), str(tensor.dtype).removeprefix("torch.")]

    return {
        "parameters": {name: describe(p) for name, p in model.named_parameters()},
        "buffers": {name: describe(b) for name, b in model.named_buffers()},
    }


def parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, str]:
    """``id(param)`` to its model name, for every parameter the optimizer holds."""
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    found: dict[int, str] = {}
    for g, group in enumerate(optimizer.param_groups):
        for i, param in enumerate(group["params"]):
            found[id(param)] = names.get(id(param), f"group{g}.param{i}")
    return found


class TrainingState:
    """The stateful whole of a :class:`Trainee`."""

    def __init__(self, trainee: Trainee) -> None:
        self.trainee = trainee
        extra = {**loader_generators(trainee.loader), **dict(trainee.generators or {})}
        self.streams = RandomStreams(extra)
        self.data = DataStream(trainee.loader, self.streams)
        self._names = parameter_names(trainee.model, trainee.optimizer)

    def close(self) -> None:
        self.data.close()

    def tensors(self) -> dict[str, torch.Tensor]:
        model, optimizer = self.trainee.model, self.trainee.optimizer
        found: dict[str, torch.Tensor] = dict(model.named_parameters())
        found.update(model.named_buffers())
        for group in optimizer.param_groups:
            for param in group["params"]:
                for key, value in optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor):
                        found[f"optimizer.{self._names[id(param)]}.{key}"] = value
        return found

    def state_dict(self) -> dict[str, Any]:
        scheduler = self.trainee.scheduler
        return {
            "model": self.trainee.model.state_dict(),
            "optimizer": self.trainee.optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "data": self.data.state_dict(),
            "streams": self.streams.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], *, streams: bool = True) -> None:
        """Restore a checkpoint; ``streams=False`` leaves the random streams as they are."""
        self.trainee.model.load_state_dict(state["model"])
        self.trainee.optimizer.load_state_dict(state["optimizer"])
        if self.trainee.scheduler is not None and state.get("scheduler") is not None:
            self.trainee.scheduler.load_state_dict(state["scheduler"])
        current = self.streams.state_dict()
        self.data.load_state_dict(state["data"])
        self.streams.load_state_dict(state["streams"] if streams else current)
