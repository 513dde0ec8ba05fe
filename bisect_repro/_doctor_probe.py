"""The separate-process half of ``doctor``: build a recipe, train a few steps, report hashes.

Run as ``python -m bisect_repro._doctor_probe`` with a JSON spec on stdin
(``{"target", "config", "steps"}``); it writes one JSON object as the last line of stdout (the
recipe's own prints go to stderr). Nothing is pickled. The object holds, right after the build:
a content hash of every parameter and buffer, a digest of every random stream (the global ones,
the loader's generators, the recipe's ``generators`` and the streams found inside the dataset and
sampler), the environment fingerprint and whether the recipe set the thread count; then, for each
of the first ``steps`` steps, the batch's sample indices, content hash and loss hash; and the
hashes of the whole state after those steps. Two such objects from two processes differ exactly
where the recipe is not reproducible across processes.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from . import env
from .data import loader_generators
from .errors import BisectReproError
from .hashing import hash_tensor, hash_tensors
from .recipe import Trainee, build
from .recorder import _describe_loader, batch_tensors, combine_digests
from .rng import RandomSource, RandomStreams, stream_digest
from .state import TrainingState

__all__ = ["find_streams", "hidden_streams", "probe", "stream_kind"]

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


def probe(target: str, config: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """Build, hash, train ``steps`` steps, hash again (see the module docstring)."""
    threads_set: list[int] = []
    set_num_threads = torch.set_num_threads

    def spy(count: int) -> None:
        threads_set.append(int(count))
        set_num_threads(count)

    torch.set_num_threads = spy  # this process is ours: note whether the recipe pins the thread count
    try:
        trainee = build(target, config)
    finally:
        torch.set_num_threads = set_num_threads
    if trainee.step is None:
        raise BisectReproError(f"{target}: the Trainee has no step function; doctor needs step=... to run the recipe")
    state = TrainingState(trainee)
    hidden = hidden_streams(trainee)
    hidden_states = RandomStreams(hidden).state_dict()
    result: dict[str, Any] = {
        "init": hash_tensors(state.tensors()),
        "streams": {name: stream_digest(value) for name, value in state.streams.state_dict().items()},
        "hidden": {name: {"kind": stream_kind(source), "digest": stream_digest(hidden_states[name])} for name, source in hidden.items()},
        "environment": env.fingerprint(),
        "threads_set": threads_set,
        "loader": _describe_loader(trainee.loader),
        "batches": [],
    }
    try:
        for _ in range(steps):
            batch, indices = state.data.next_batch()
            tensors, others = batch_tensors(batch)
            content = combine_digests([*hash_tensors(tensors).values(), *others])
            loss = trainee.step(batch)
            loss_hash = hash_tensor(loss.detach()) if isinstance(loss, torch.Tensor) else repr(loss)
            result["batches"].append({"indices": indices, "content": content, "base_seed": state.data.base_seed, "loss": loss_hash})
        result["final"] = hash_tensors(state.tensors())
    finally:
        state.close()
    return result


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # the recipe's prints must not mix with the result
    spec: dict[str, Any] = {}
    try:
        spec = json.loads(sys.stdin.read())
        result = probe(spec["target"], spec.get("config", {}), int(spec["steps"]))
    except BisectReproError as error:
        result = {"error": str(error)}
    except Exception as error:  # a recipe that fails while training: one line, no traceback
        result = {"error": f"{spec.get('target')}: failed while training ({type(error).__name__}: {error})"}
    out.write("\n" + json.dumps(result) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
