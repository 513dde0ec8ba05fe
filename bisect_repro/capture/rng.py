"""Every random stream of a training process, captured and restored as plain data.

The global streams are Python's ``random``, NumPy's legacy global ``RandomState``, torch's CPU
generator and the generator of every CUDA device; extra streams are the recipe's own
``torch.Generator``, ``numpy.random.Generator``, ``numpy.random.RandomState`` and
``random.Random`` objects, by name.

A stream's state is a small tree of JSON values and tensors (never a pickle), so it goes through
the run store's codec unchanged. It is guaranteed that after ``load_state_dict(state_dict())``
every stream yields the same draws as it would have at capture time.

Design decisions:
- A stream object appears under one name only: ``DataLoader(generator=g)`` hands ``g`` to its
  ``RandomSampler``, and both are one stream.
- CUDA streams are captured only when CUDA is already initialised, so recording never creates a
  CUDA context in a CPU-only recipe; in a distributed run, only the rank's current device's.
- A stream's name says what it is (:func:`stream_role`): the global streams and ``cuda:<i>`` are
  named here, a loader's and its samplers' generators by
  :func:`~bisect_repro.capture.data.loader_generators` (``loader.generator``, ``sampler.generator``,
  ``batch_sampler.generator``), the streams found inside a loader by attribute path by
  :func:`~bisect_repro.capture.hidden.find_streams` (``loader.dataset.rng``,
  ``loader.sampler.generator``; a framework's second loader adds ``#1``), and the recipe's own by
  the names it gives them.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import numpy as np
import torch

from ..errors import BisectReproError
from ..trainee import RandomSource

__all__ = [
    "GLOBAL_STREAMS",
    "RandomSource",
    "RandomStreams",
    "StreamRole",
    "draw_once",
    "loader_draws_from",
    "stream_role",
    "tree_digest",
]


GLOBAL_STREAMS = ("python", "numpy", "torch")


class StreamRole(str, Enum):
    """What a random stream is to a training process, told by its name (:func:`stream_role`)."""

    GLOBAL = "global"
    """One of :data:`GLOBAL_STREAMS`: Python's ``random``, NumPy's global ``RandomState``, torch's
    CPU generator."""
    CUDA = "cuda"
    """A CUDA device's generator: ``cuda:0``."""
    LOADER = "loader"
    """The DataLoader's own ``generator=``: ``loader.generator``."""
    SAMPLER = "sampler"
    """A sampler's generator (``sampler.generator``, ``batch_sampler.generator``), or a stream found
    inside a sampler (``loader.sampler.generator``, ``loader.batch_sampler.sampler.rng``)."""
    DATASET = "dataset"
    """A stream found inside the dataset, such as an augmentation's:
    ``loader.dataset.transforms[0].rng``."""
    RECIPE = "recipe"
    """One of the recipe's own ``generators``, under the name the recipe gave it."""


_SAMPLER_GENERATORS = ("sampler.generator", "batch_sampler.generator")
_LOADER_COPY = re.compile(r"#\d+$")  # a framework's second, third... loader: loader.generator#1


def _inside(name: str, root: str) -> bool:
    """``name`` is ``root`` or a path below it (``root.attribute``, ``root[0]``)."""
    return name == root or name.startswith((f"{root}.", f"{root}["))


def stream_role(name: str) -> StreamRole:
    """The role of the stream named ``name``, by how the names are made (see the module
    docstring)."""
    base = _LOADER_COPY.sub("", name)
    if name in GLOBAL_STREAMS:
        return StreamRole.GLOBAL
    if name.startswith("cuda:"):
        return StreamRole.CUDA
    if base == "loader.generator":
        return StreamRole.LOADER
    if (
        base in _SAMPLER_GENERATORS
        or _inside(base, "loader.sampler")
        or _inside(base, "loader.batch_sampler")
    ):
        return StreamRole.SAMPLER
    if _inside(base, "loader.dataset"):
        return StreamRole.DATASET
    return StreamRole.RECIPE


def loader_draws_from(name: str) -> bool:
    """Whether a DataLoader shuffles, or seeds its workers, from the stream ``name``: its own
    generator, a sampler's, or torch's global stream (which it uses without a ``generator=``)."""
    return name == "torch" or stream_role(name) in (StreamRole.LOADER, StreamRole.SAMPLER)


def _capture(source: RandomSource) -> dict[str, Any]:
    if isinstance(source, torch.Generator):
        return {
            "kind": "torch.Generator",
            "device": str(source.device),
            "state": source.get_state(),
        }
    if isinstance(source, np.random.Generator):
        return {"kind": "numpy.Generator", "state": _numpy_bitgen_state(source.bit_generator.state)}
    if isinstance(source, np.random.RandomState):
        return _numpy_legacy(source.get_state(legacy=True), "numpy.RandomState")
    if isinstance(source, random.Random):
        return _python(source.getstate(), "random.Random")
    raise BisectReproError(
        f"generators: {type(source).__name__} is not a random stream bisect-repro knows; "
        "pass a torch.Generator, numpy.random.Generator, numpy.random.RandomState or random.Random"
    )


def _restore(source: RandomSource, state: Mapping[str, Any]) -> None:
    if isinstance(source, torch.Generator):
        source.set_state(state["state"])
    elif isinstance(source, np.random.Generator):
        source.bit_generator.state = _numpy_bitgen_from(state["state"])
    elif isinstance(source, np.random.RandomState):
        source.set_state(_numpy_legacy_tuple(state))
    else:
        source.setstate(_python_tuple(state))


def _python(state: tuple[Any, ...], kind: str = "python") -> dict[str, Any]:
    version, internal, gauss_next = state
    # 3x faster than torch.tensor(tuple)
    words = np.fromiter(internal, dtype=np.int64, count=len(internal))
    return {
        "kind": kind,
        "version": version,
        "state": torch.from_numpy(words),
        "gauss_next": gauss_next,
    }


def _python_tuple(state: Mapping[str, Any]) -> tuple[Any, ...]:
    return (state["version"], tuple(int(v) for v in state["state"].tolist()), state["gauss_next"])


def _numpy_legacy(state: dict[str, Any] | tuple[Any, ...], kind: str = "numpy") -> dict[str, Any]:
    # get_state(legacy=True) of a RandomState over another bit generator than MT19937
    if isinstance(state, dict):
        generator = state.get("bit_generator")
        raise BisectReproError(
            f"{kind}: a RandomState drawing from {generator}, not MT19937, cannot be captured "
            "(bisect-repro saves a "
            f"RandomState's MT19937 state); draw from numpy.random.Generator({generator}()) "
            "instead, or keep MT19937"
        )
    name, key, pos, has_gauss, cached = state
    return {
        "kind": kind,
        "bit_generator": name,
        "key": torch.from_numpy(key.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _numpy_legacy_tuple(state: Mapping[str, Any]) -> tuple[Any, ...]:
    key = state["key"].numpy().astype(np.uint32)
    return (state["bit_generator"], key, state["pos"], state["has_gauss"], state["cached_gaussian"])


def _numpy_bitgen_state(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: _numpy_bitgen_state(v) for k, v in state.items()}
    if isinstance(state, np.ndarray):
        return {"__ndarray__": state.tolist(), "dtype": str(state.dtype)}
    if isinstance(state, np.integer):
        return int(state)
    return state


def _numpy_bitgen_from(state: Any) -> Any:
    if isinstance(state, dict):
        if "__ndarray__" in state:
            return np.array(state["__ndarray__"], dtype=state["dtype"])
        return {k: _numpy_bitgen_from(v) for k, v in state.items()}
    return state


def _cuda_devices() -> list[int]:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # a rank's own device: another rank's would get a context here
        return [torch.cuda.current_device()]
    return list(range(torch.cuda.device_count()))


def tree_digest(state: Mapping[str, Any]) -> str:
    """A short digest of a state tree (a stream's state, a ``state_dict``), for telling whether two
    are equal."""

    digest = hashlib.blake2b(digest_size=8)

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(f"<tensor {value.dtype} {tuple(value.shape)}>".encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, Mapping):
            for key in sorted(value, key=str):
                digest.update(f"<key {key!s}>".encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"<list {len(value)}>".encode())
            for item in value:
                feed(item)
        else:
            digest.update(json.dumps(value).encode())

    feed(state)
    return digest.hexdigest()


class RandomStreams:
    """The global random streams plus named extra ones, as one stateful object.

    It is guaranteed that after ``load_state_dict(sd)`` every stream named in ``sd`` is set to
    the state it had when ``sd`` was captured.
    """

    def __init__(self, extra: Mapping[str, RandomSource] | None = None) -> None:
        self._extra: dict[str, RandomSource] = {}
        seen: set[int] = set()
        for name, source in (extra or {}).items():
            if id(source) in seen or source is None:
                continue
            seen.add(id(source))
            self._extra[name] = source

    def names(self) -> list[str]:
        cuda = [f"cuda:{i}" for i in _cuda_devices()]
        return [*GLOBAL_STREAMS, *cuda, *self._extra]

    def state_dict(self) -> dict[str, dict[str, Any]]:
        states: dict[str, dict[str, Any]] = {
            "python": _python(random.getstate()),
            "numpy": _numpy_legacy(np.random.get_state(legacy=True)),
            "torch": {"kind": "torch", "state": torch.get_rng_state()},
        }
        for index in _cuda_devices():
            states[f"cuda:{index}"] = {"kind": "cuda", "state": torch.cuda.get_rng_state(index)}
        for name, source in self._extra.items():
            states[name] = _capture(source)
        return states

    def load_state_dict(
        self, state: Mapping[str, Mapping[str, Any]], only: Iterable[str] | None = None
    ) -> None:
        wanted = set(state) if only is None else set(only) & set(state)
        for name in wanted:
            value = state[name]
            if name == "python":
                random.setstate(_python_tuple(value))
            elif name == "numpy":
                np.random.set_state(_numpy_legacy_tuple(value))
            elif name == "torch":
                torch.set_rng_state(value["state"])
            elif name.startswith("cuda:"):
                index = int(name.split(":", 1)[1])
                if index in _cuda_devices() or (
                    torch.cuda.is_available() and index < torch.cuda.device_count()
                ):
                    torch.cuda.set_rng_state(value["state"], index)
            elif name in self._extra:
                _restore(self._extra[name], value)


def draw_once(name: str, sources: Mapping[str, RandomSource]) -> None:
    """Advance the stream ``name`` by one draw: a global stream in this process, or one of
    ``sources``."""
    if name == "python":
        random.random()
    elif name == "numpy":
        np.random.random()
    elif name == "torch":
        torch.rand(())
    elif name.startswith("cuda:"):
        torch.rand((), device=name)
    elif isinstance(source := sources[name], torch.Generator):
        torch.rand((), generator=source, device=source.device)
    elif isinstance(source, np.random.Generator):
        source.random()
    elif isinstance(source, np.random.RandomState):
        source.random_sample()
    else:
        source.random()
