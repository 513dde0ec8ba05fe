"""Loader and sampler state: where a training run is in its data, and how to get back there.

:class:`DataStream` iterates any iterable of batches across epochs and records, for each batch,
the sample indices the sampler yielded (for a map-style ``DataLoader``). Its ``state_dict`` is
the position (epoch, batch within the epoch), the workers' base seed, and the state of every
random stream at the start of the epoch: what decides the epoch's order and its worker seeds;
with a ``DistributedSampler``, also its seed, epoch, rank and number of replicas (``sampler``).
At the start of each epoch the stream calls the sampler's ``set_epoch(epoch)`` when it has one,
as a ``DistributedSampler`` needs to shuffle each epoch differently.

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

:func:`describe_loader` is the loader's settings that decide the data, as a run records them.
The streams a recipe hides in its dataset are :mod:`bisect_repro.capture.hidden`'s.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from ..errors import RecipeError
from .rng import RandomSource, RandomStreams

__all__ = [
    "DataStream",
    "IndexTap",
    "describe_loader",
    "loader_generators",
    "next_micro_batches",
    "sampler_state",
    "tap_indices",
    "untap_indices",
]


class IndexTap:
    """Stands in for a loader's index sampler and remembers what it yielded, in order.

    Pickled or copied (a loader deep-copied, or sent to a worker process), it is its inner sampler:
    the copy is the user's loader as it was, untapped."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.pending: collections.deque[Any] = collections.deque()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # rebuilt as the inner sampler (itself copied), by a function of the standard library
        return operator.itemgetter(0), ((self.inner,),)

    def __iter__(self) -> Iterator[Any]:
        for item in self.inner:
            self.pending.append(item)
            yield item

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def pop_indices(self) -> list[int] | None:
        """The sample indices of the oldest batch not yet asked for (``None`` when none is
        waiting)."""
        if not self.pending:
            return None
        item = self.pending.popleft()
        return [int(i) for i in item] if isinstance(item, (list, tuple)) else [int(item)]


def tap_indices(loader: Any) -> IndexTap | None:
    """Put an :class:`IndexTap` in the place of a map-style ``DataLoader``'s (batch) sampler, before
    it is iterated; ``None`` for any other source (an iterable dataset's indices are its own)."""
    if not isinstance(loader, DataLoader) or loader._dataset_kind:
        return None
    attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    tap = IndexTap(getattr(loader, attribute))
    object.__setattr__(loader, attribute, tap)  # DataLoader forbids plain assignment
    return tap


def untap_indices(loader: DataLoader[Any], tap: IndexTap) -> None:
    """Give the loader its own sampler back."""
    attribute = "batch_sampler" if loader.batch_sampler is tap else "sampler"
    object.__setattr__(loader, attribute, tap.inner)


def loader_generators(loader: Iterable[Any]) -> dict[str, RandomSource]:
    """The random streams a DataLoader owns: its generator and its sampler's."""
    found: dict[str, RandomSource] = {}
    if not isinstance(loader, DataLoader):
        return found
    if loader.generator is not None:
        found["loader.generator"] = loader.generator
    for name, sampler in (
        ("sampler", loader.sampler),
        ("batch_sampler", getattr(loader.batch_sampler, "sampler", None)),
    ):
        generator = getattr(sampler, "generator", None)
        if generator is not None and all(generator is not g for g in found.values()):
            found[f"{name}.generator"] = generator
    return found


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
        self._tap = tap_indices(loader)

    def close(self) -> None:
        """Give the loader its own sampler back."""
        if self._tap is not None and isinstance(self.loader, DataLoader):
            untap_indices(self.loader, self._tap)
            self._tap = None
        self._iterator = None

    def _start_epoch(self) -> None:
        sampler: Any = getattr(self.loader, "sampler", None)
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
                    raise RecipeError(
                        "loader: yielded no batches in an epoch; give the recipe a non-empty loader"
                    ) from None
                self._iterator = None
                self.epoch += 1
                self.batch_in_epoch = 0
                continue
            self.batch_in_epoch += 1
            return batch, self._tap.pop_indices() if self._tap is not None else None

    def state_dict(self) -> dict[str, Any]:
        state = {
            "epoch": self.epoch,
            "batch": self.batch_in_epoch,
            "base_seed": self.base_seed,
            "epoch_streams": self._epoch_streams if self._iterator is not None else None,
        }
        sampler = sampler_state(getattr(self.loader, "sampler", None))
        if sampler is not None:
            state["sampler"] = sampler
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to the recorded position; the caller restores the step's streams afterwards."""
        self._iterator = None
        self.epoch, self.batch_in_epoch = int(state["epoch"]), 0
        target = int(state["batch"])
        if state.get("epoch_streams") is None or target == 0:
            return  # the epoch starts at the next fetch, from the streams the caller restores
        # Even at the end of an epoch the epoch is fetched again: a sampler may draw once more as it
        # ends (RandomSampler draws a permutation for the remainder), at the next fetch, as it did.
        self.streams.load_state_dict(state["epoch_streams"])
        length = _length(self.loader)
        if length is not None and target > length:
            raise RecipeError(
                f"loader: the recorded position is batch {target} of an epoch of {length}; was the "
                "dataset changed?"
            )
        for _ in range(target):  # bounded by one epoch: a position past its end stops at the end
            self.next_batch()
            if self.epoch != int(state["epoch"]):
                raise RecipeError(
                    "loader: yields fewer batches than the recorded position; was the dataset "
                    "changed?"
                )


def _length(loader: Any) -> int | None:
    """The batches in an epoch of ``loader``, when it says (``len``); ``None`` otherwise."""
    try:
        return len(loader)
    except (TypeError, ValueError, NotImplementedError):
        return None


_SAMPLER_FIELDS = ("seed", "epoch", "rank", "num_replicas", "shuffle", "drop_last")


def sampler_state(sampler: Any) -> dict[str, Any] | None:
    """A ``DistributedSampler``'s (or a sampler like it) seed, epoch, rank, num_replicas, shuffle
    and drop_last; ``None`` for a sampler that does not split the data between ranks."""
    sampler = getattr(sampler, "inner", sampler)
    if not all(hasattr(sampler, name) for name in ("rank", "num_replicas", "epoch")):
        return None
    found = {name: getattr(sampler, name, None) for name in _SAMPLER_FIELDS}
    return {
        "type": type(sampler).__name__,
        **{k: v if isinstance(v, (int, bool, type(None))) else str(v) for k, v in found.items()},
    }


def describe_loader(loader: Any) -> dict[str, Any]:
    """The loader's settings that decide the data: batch size, workers, sampler, whether it has a
    generator."""
    if not isinstance(loader, DataLoader):
        return {"type": type(loader).__name__}
    # a custom batch sampler (any iterable of index lists) may have no sampler of its own: it is
    # described itself
    sampler = (
        getattr(loader.batch_sampler, "sampler", loader.batch_sampler)
        if loader.batch_sampler is not None
        else loader.sampler
    )
    return {
        "type": "DataLoader",
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "sampler": type(getattr(sampler, "inner", sampler)).__name__,
        "generator": loader.generator is not None,
        "worker_init_fn": loader.worker_init_fn is not None,
        "persistent_workers": loader.persistent_workers,
        "drop_last": loader.drop_last,
    }


def next_micro_batches(data: DataStream, accumulate: int) -> tuple[Any, list[int] | None]:
    """A step's batch: the next one, or with ``accumulate`` above 1 a list of that many
    micro-batches; and the step's sample indices, all its micro-batches' in order (``None`` when any
    is unknown)."""
    if accumulate == 1:
        return data.next_batch()
    parts = [data.next_batch() for _ in range(accumulate)]
    known = [indices for _, indices in parts if indices is not None]
    return [batch for batch, _ in parts], [i for indices in known for i in indices] if len(
        known
    ) == len(parts) else None
