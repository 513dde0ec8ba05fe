"""Random streams a recipe keeps where no ``state_dict`` reaches: inside its dataset and samplers.

:func:`hidden_streams` finds ``numpy.random.Generator``, ``RandomState``, ``random.Random`` and
``torch.Generator`` objects in the attributes of the dataset and samplers (an augmentation's
``self.rng``), named by path. ``doctor`` compares them across processes.

Where guarantees stop: it is a bounded search, not a proof of absence: it looks a few attributes
deep and into the first items of lists and dicts only, so a stream held deeper, in a closure or
inside an ``nn.Module`` is not seen.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from ..trainee import Trainee
from .data import loader_generators
from .rng import RandomSource

__all__ = ["find_streams", "hidden_streams", "recipe_streams", "stream_kind"]

_SOURCES = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
_LEAVES = (str, bytes, int, float, bool, type(None), torch.Tensor, np.ndarray, torch.nn.Module)
# of a list or dict looked into: enough for a few augmentations, not a dataset's samples
_MAX_ITEMS = 32


def stream_kind(source: RandomSource) -> str:
    """``numpy.random.Generator``, ``torch.Generator``, ...: the class as users write it."""
    kind = type(source)
    module = (
        "numpy.random"
        if kind.__module__.startswith("numpy")
        else kind.__module__.replace("torch._C", "torch")
    )
    return f"{module}.{kind.__name__}"


def find_streams(
    loader: Any, *, depth: int = 3, known: Iterable[RandomSource] = ()
) -> dict[str, RandomSource]:
    """Random streams held inside a DataLoader's dataset and samplers, by attribute path.

    Looks ``depth`` attributes deep (lists, tuples and dicts count as one level each), so that
    ``loader.dataset.rng``, ``loader.dataset.transforms[0].rng`` or
    ``loader.dataset.dataset.rng`` (a ``Subset``) are found; streams in ``known`` are left out.
    """
    found: dict[str, RandomSource] = {}
    seen = {id(source) for source in known}

    def visit(value: Any, path: str, left: int) -> None:
        if isinstance(value, _SOURCES):
            if id(value) not in seen:
                seen.add(id(value))
                found[path] = value
            return
        if left == 0 or isinstance(value, _LEAVES) or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, Mapping):
            items: Iterable[tuple[str, Any]] = (
                (f"{path}[{key!r}]", item) for key, item in list(value.items())[:_MAX_ITEMS]
            )
        elif isinstance(value, (list, tuple)):
            items = ((f"{path}[{index}]", item) for index, item in enumerate(value[:_MAX_ITEMS]))
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            items = (
                (f"{path}.{name}", item)
                for name, item in vars(value).items()
                if not name.startswith("__")
            )
        else:
            return
        for item_path, item in items:
            visit(item, item_path, left - 1)

    for name in ("dataset", "sampler", "batch_sampler"):
        value = getattr(loader, name, None)
        value = getattr(value, "inner", value)  # a DataStream's tap stands in for the sampler
        if value is not None:
            visit(value, f"loader.{name}", depth)
    return found


def hidden_streams(trainee: Trainee) -> dict[str, RandomSource]:
    """The streams inside a trainee's dataset and samplers that its ``TrainingState`` does not
    know."""
    known = [*loader_generators(trainee.source).values(), *(trainee.generators or {}).values()]
    return find_streams(trainee.loader, known=known)


def recipe_streams(trainee: Trainee) -> dict[str, RandomSource]:
    """Every stream a trainee owns by name: the loader's, its ``generators``, those hidden in the
    dataset."""
    return {
        **loader_generators(trainee.source),
        **dict(trainee.generators or {}),
        **hidden_streams(trainee),
    }
