"""What the framework integrations share: JSON-safe settings, the streams inside a framework's
data loader, and the recorder they drive from their hooks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..capture.hidden import find_streams
from ..record.recorder import FrameworkRecorder, RecordOptions
from ..stateful import Stateful
from ..trainee import RandomSource, Trainee

__all__ = ["json_safe", "loader_streams", "start_recorder"]


def json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as JSON: values that JSON cannot hold are kept as their ``repr``."""
    found: dict[str, Any] = {}
    for key, value in values.items():
        try:
            json.dumps(value)
            found[str(key)] = value
        except (TypeError, ValueError):
            found[str(key)] = repr(value)
    return found


def loader_streams(loaders: Iterable[Any]) -> dict[str, RandomSource]:
    """The random streams inside a framework's train data loader(s), by attribute path (its
    generator, its sampler's, a seedable sampler's own), so that snapshots capture them."""
    found: dict[str, RandomSource] = {}
    for index, loader in enumerate(loaders):
        for path, source in find_streams(loader, depth=5).items():
            found[path if index == 0 else f"{path}#{index}"] = source
        generator = getattr(loader, "generator", None)
        if isinstance(generator, torch.Generator) and all(
            generator is not g for g in found.values()
        ):
            found[f"loader.generator{'' if index == 0 else f'#{index}'}"] = generator
    return found


def start_recorder(
    out: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Stateful | None,
    streams: Mapping[str, RandomSource],
    options: RecordOptions,
    steps: int | None,
    config: Mapping[str, Any],
    environment: Mapping[str, Any],
    start_step: int,
) -> FrameworkRecorder:
    """A recorder for a loop a framework drives: it snapshots at the framework's optimizer steps.

    ``options`` are the callback's; ``steps`` is how many the framework will run (``None``: not
    known)."""
    trainee = Trainee(model, optimizer, (), scheduler=scheduler, generators=dict(streams))
    options = replace(options, steps=steps)
    return FrameworkRecorder(
        out,
        trainee,
        options,
        config=json_safe(config),
        start_step=start_step,
        environment=environment,
    )
