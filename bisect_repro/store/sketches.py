"""A snapshot's sketches, read and validated: the parameters' linear sketches (defined in
:mod:`bisect_repro.capture.sketch`) by name, and the activations' of the step that started at the
previous snapshot (:mod:`bisect_repro.capture.activations`) by module, in the order they ran.

A snapshot holds ``sketch``: ``{"width": int, "seed": int, "names": [str, ...], "values":
float64[len(names), width]}``, and may hold ``activations``: the same with ``step``, the step
whose forward pass they were taken in. :func:`read_sketches` accepts it only whole: ``width`` from 1
to ``MAX_WIDTH``, ``names`` distinct text, ``values`` a finite-or-not float64 tensor of exactly that
shape; anything else is a :class:`RunFormatError` naming the file. A snapshot without ``sketch``
(recorded before sketches existed) reads as ``None``, which compare treats as "no distance".

Where the guarantees stop: the values are read as recorded; a crafted run can carry consistent
wrong sketches, as it can carry wrong hashes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import RunFormatError

__all__ = ["MAX_WIDTH", "Sketches", "read_sketches"]

MAX_WIDTH = 4096


@dataclass(frozen=True)
class Sketches:
    """One snapshot's sketches: ``values[name]`` is float64[width]."""

    width: int
    seed: int
    values: dict[str, np.ndarray]
    step: int | None = None
    """For activations: the step whose forward pass they were taken in."""


def _problem(found: Any) -> str | None:
    """What is wrong with a snapshot's ``sketch``, or ``None``."""
    if not isinstance(found, dict):
        return f"'sketch' is a {type(found).__name__}, not a mapping"
    width, seed, names, values = (found.get(k) for k in ("width", "seed", "names", "values"))
    if type(width) is not int or not 1 <= width <= MAX_WIDTH:
        return f"sketch width {width!r} is not from 1 to {MAX_WIDTH}"
    if type(seed) is not int:
        return f"sketch seed {seed!r} is not an integer"
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        return "sketch names are not distinct text"
    if (
        not isinstance(values, torch.Tensor)
        or values.dtype != torch.float64
        or tuple(values.shape) != (len(names), width)
    ):
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        return f"sketch values {shape} are not float64[{len(names)}, {width}]"
    return None


def read_sketches(tree: dict[str, Any], file: Path, key: str = "sketch") -> Sketches | None:
    """The sketches of a decoded snapshot (``key``: ``sketch`` or ``activations``), checked;
    ``None`` for a snapshot without them."""
    found = tree.get(key)
    if found is None:
        return None
    problem = _problem(found)
    step = found.get("step") if isinstance(found, dict) else None
    if problem is None and key != "sketch" and (type(step) is not int or step < 0):
        problem = f"{key} step {step!r} is not a step number"
    if problem is not None:
        raise RunFormatError(
            file,
            problem.replace("sketch ", f"{key} ", 1),
            "the file is damaged; record the run again",
        )
    values = found["values"].numpy()
    return Sketches(
        found["width"],
        found["seed"],
        {name: values[i] for i, name in enumerate(found["names"])},
        step,
    )
