"""Loader and sampler state: where a training run is in its data, and how to get back there.

:class:`DataStream` iterates any iterable of batches across epochs and records, for each batch,
the sample indices the sampler yielded (for a map-style ``DataLoader``). Its ``state_dict`` is
the position (epoch, batch within the epoch), the workers' base seed, and the state of every
random stream at the start of the epoch: what decides the epoch's order and its worker seeds.

Resuming (``load_state_dict``) restores the epoch-start streams, starts the epoch again, and
fetches and discards the batches already consumed in it. It is guaranteed that the batches that
follow are the ones the original run saw, including random augmentation drawn in workers, since
workers are seeded from the epoch's base seed and see the same items in the same order. The
caller then restores the streams of the resumed step (see ``state.TrainingState``).

Where guarantees stop:
- The fast-forward costs the data loading (not the training) of the batches skipped.
- A sampler that draws from a global stream lazily, batch by batch, while training also draws
  from it, and ``persistent_workers=True`` (workers carry their streams across epochs), are not
  reproduced exactly mid-run.
- Sample indices are known for map-style ``DataLoader`` s only; other iterables record none.

:func:`hidden_streams` finds the random streams a recipe keeps where no ``state_dict`` reaches:
``numpy.random.Generator``, ``RandomState``, ``random.Random`` and ``torch.Generator`` objects in
the attributes of the dataset and samplers (an augmentation's ``self.rng``), named by path.
``doctor`` compares them across processes; it is a bounded search, not a proof of absence: it
looks a few attributes deep and into the first items of lists and dicts only, so a stream held
deeper, in a closure or inside an ``nn.Module`` is not seen.
"""

from __future__ import annotations

import collections
import contextlib
import random
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from .errors import RecipeError
from .recipe import Trainee
from .rng import RandomSource, RandomStreams

__all__ = ["DataStream", "find_streams", "hidden_streams", "loader_generators", "stream_kind"]


class _IndexTap:
    """Stands in for a loader's index sampler and remembers what it yielded, in order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: collections.deque[Any] = collections.deque()

    def __iter__(self) -> Iterator[Any]:
        for item in self.inner:
            self.pending.append(item)
            yield item

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def loader_generators(loader: Iterable[Any]) -> dict[str, RandomSource]:
    """The random streams a DataLoader owns: its generator and its sampler's."""
    found: dict[str, RandomSource] = {}
    if not isinstance(loader, DataLoader):
        return found
    if loader.generator is not None:
        found["loader.generator"] = loader.generator
    for name, sampler in (("sampler", loader.sampler), ("batch_sampler", getattr(loader.batch_sampler, "sampler", None))):
        generator = getattr(sampler, "generator", None)
        if generator is not None and all(generator is not g for g in found.values()):
            found[f"{name}.generator"] = generator
    return found


def _sampler_of(loader: DataLoader) -> Any:
    return loader.batch_sampler if loader.batch_sampler is not None else loader.sampler


class DataStream:
    """Batches from a loader across epochs, with their sample indices and a resumable state."""

    def __init__(self, loader: Iterable[Any], streams: RandomStreams) -> None:
        self.loader = loader
        self.streams = streams
        self.epoch = 0
        self.batch_in_epoch = 0
        self.base_seed: int | None = None
        self._epoch_streams: dict[str, Any] | None = None
        self._iterator: Iterator[Any] | None = None
        self._tap: _IndexTap | None = None
        if isinstance(loader, DataLoader) and not loader._dataset_kind:  # map-style
            self._tap = _IndexTap(_sampler_of(loader))
            attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
            object.__setattr__(loader, attribute, self._tap)  # DataLoader forbids plain assignment

    def close(self) -> None:
        """Give the loader its own sampler back."""
        if self._tap is not None and isinstance(self.loader, DataLoader):
            attribute = "batch_sampler" if self.loader.batch_sampler is self._tap else "sampler"
            object.__setattr__(self.loader, attribute, self._tap.inner)
            self._tap = None
        self._iterator = None

    def _start_epoch(self) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)
        self._epoch_streams = self.streams.state_dict()
        if self._tap is not None:
            self._tap.pending.clear()
        self._iterator = iter(self.loader)
        base_seed = getattr(self._iterator, "_base_seed", None)
        self.base_seed = int(base_seed) if base_seed is not None else None

    def next_batch(self) -> tuple[Any, list[int] | None]:
        """The next batch and its sample indices (``None`` when unknown)."""
        empty_epochs = 0
        while True:
            if self._iterator is None:
                self._start_epoch()
            assert self._iterator is not None
            try:
                batch = next(self._iterator)
            except StopIteration:
                empty_epochs = empty_epochs + 1 if self.batch_in_epoch == 0 else 0
                if empty_epochs > 1:
                    raise RecipeError("loader: yielded no batches in an epoch; give the recipe a non-empty loader") from None
                self._iterator = None
                self.epoch += 1
                self.batch_in_epoch = 0
                continue
            self.batch_in_epoch += 1
            indices = None
            if self._tap is not None and self._tap.pending:
                item = self._tap.pending.popleft()
                indices = [int(i) for i in item] if isinstance(item, (list, tuple)) else [int(item)]
            return batch, indices

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch": self.batch_in_epoch,
            "base_seed": self.base_seed,
            "epoch_streams": self._epoch_streams if self._iterator is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to the recorded position; the caller restores the step's streams afterwards."""
        self._iterator = None
        self.epoch, self.batch_in_epoch = int(state["epoch"]), 0
        target = int(state["batch"])
        length = None
        with contextlib.suppress(TypeError):
            length = len(self.loader)  # type: ignore[arg-type]
        if state.get("epoch_streams") is None or target == 0:
            return  # the epoch starts at the next fetch, from the streams the caller restores
        if length is not None and target >= length:
            self.epoch += 1
            return
        self.streams.load_state_dict(state["epoch_streams"])
        for _ in range(target):
            self.next_batch()
        if self.epoch != int(state["epoch"]):
            raise RecipeError("loader: yields fewer batches than the recorded position; was the dataset changed?")


# -- random streams hidden in the data ----------------------------------------------------------
_SOURCES = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
_LEAVES = (str, bytes, int, float, bool, type(None), torch.Tensor, np.ndarray, torch.nn.Module)
_MAX_ITEMS = 32  # of a list or dict looked into: enough for a few augmentations, not a dataset's samples


def stream_kind(source: RandomSource) -> str:
    """``numpy.random.Generator``, ``torch.Generator``, ...: the class as users write it."""
    kind = type(source)
    module = "numpy.random" if kind.__module__.startswith("numpy") else kind.__module__.replace("torch._C", "torch")
    return f"{module}.{kind.__name__}"


def find_streams(loader: Any, *, depth: int = 3, known: Iterable[RandomSource] = ()) -> dict[str, RandomSource]:
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
            items: Iterable[tuple[str, Any]] = ((f"{path}[{key!r}]", item) for key, item in list(value.items())[:_MAX_ITEMS])
        elif isinstance(value, (list, tuple)):
            items = ((f"{path}[{index}]", item) for index, item in enumerate(value[:_MAX_ITEMS]))
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            items = ((f"{path}.{name}", item) for name, item in vars(value).items() if not name.startswith("__"))
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
    """The streams inside a trainee's dataset and samplers that its ``TrainingState`` does not know."""
    known = [*loader_generators(trainee.loader).values(), *(trainee.generators or {}).values()]
    return find_streams(trainee.loader, known=known)
