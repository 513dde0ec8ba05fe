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
import sys
from collections.abc import Mapping
from typing import Any

import torch

from . import env
from .doctor import hidden_streams, stream_kind
from .errors import BisectReproError
from .hashing import hash_tensor, hash_tensors
from .recipe import build
from .recorder import _describe_loader, batch_tensors, combine_digests
from .rng import RandomStreams, stream_digest
from .state import TrainingState

__all__ = ["probe"]


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
