"""The separate-process half of ``doctor``: build a recipe, train a few steps, report hashes.

Both sides live here, so that the format they exchange is defined in one place. The child is
``python -m bisect_repro.probe`` with a JSON spec on stdin (``{"target", "config", "steps"}``); it
writes one JSON object as the last line of stdout (the recipe's own prints go to stderr). Nothing
is pickled. The parent side is :class:`Probe`, which starts a child with a chosen
``PYTHONHASHSEED`` and reads its object, and :func:`differences`, what two objects disagree on.

The object holds, right after the build:
a content hash of every parameter and buffer, a digest of every random stream (the global ones,
the loader's generators, the recipe's ``generators`` and the streams found inside the dataset and
sampler), the environment fingerprint and whether the recipe set the thread count; then, for each
of the first ``steps`` steps, the batch's sample indices, content hash and loss hash; and the
hashes of the whole state after those steps. Two such objects from two processes differ exactly
where the recipe is not reproducible across processes.

A child is started before ``doctor`` builds the recipe in its own process and read afterwards, so
its cost overlaps doctor's own work. Where guarantees stop: the child inherits this process's
environment variables (with this package first on ``PYTHONPATH``), not its in-process settings
(thread count, determinism switches), which the recipe must set itself; a child that dies without
writing its object is reported by its exit code and last line of stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from . import env
from .data import hidden_streams, stream_kind
from .errors import BisectReproError, RecipeError
from .hashing import hash_tensor, hash_tensors
from .recipe import build
from .recorder import _describe_loader, batch_tensors, combine_digests
from .rng import RandomStreams, stream_digest
from .state import TrainingState

__all__ = ["Probe", "differences", "probe"]


# -- the child ----------------------------------------------------------------------------------
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


# -- the parent side ----------------------------------------------------------------------------
class Probe:
    """One ``bisect_repro.probe`` process, started now, read when its result is wanted."""

    def __init__(self, target: str, config: Mapping[str, Any], steps: int, hash_seed: str) -> None:
        package_root = str(Path(__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        environment = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": path}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bisect_repro.probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            text=True,
        )
        spec = json.dumps({"target": target, "config": dict(config), "steps": steps})
        self._output: tuple[str, str] = ("", "")
        self._reader = threading.Thread(target=self._read, args=(spec,), daemon=True)
        self._reader.start()

    def _read(self, spec: str) -> None:
        self._output = self._process.communicate(spec)

    def result(self) -> dict[str, Any]:
        self._reader.join()
        stdout, stderr = self._output
        lines = [line for line in stdout.splitlines() if line.strip()]
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        if not isinstance(result, dict):
            last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "no output")
            raise BisectReproError(f"doctor: the recipe's process exited with code {self._process.returncode} ({last.strip()})")
        if "error" in result:
            raise RecipeError(result["error"])
        return result

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._reader.join(timeout=5)


def _first_batch(a: dict[str, Any], b: dict[str, Any], key: str, *, same_indices: bool = False) -> int | None:
    for index, (x, y) in enumerate(zip(a["batches"], b["batches"], strict=False)):
        if (not same_indices or x["indices"] == y["indices"]) and x[key] != y[key]:
            return index
    return None


def differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What differs between two probes' results."""

    def names(key: str) -> list[str]:
        return [n for n in a[key] if n in b[key] and a[key][n] != b[key][n]]

    return {
        "init": names("init"),
        "streams": names("streams"),
        "hidden": names("hidden"),
        "order": _first_batch(a, b, "indices"),
        "content": _first_batch(a, b, "content", same_indices=True),
        "base_seed": _first_batch(a, b, "base_seed"),
        "loss": _first_batch(a, b, "loss"),
        "final": names("final"),
    }


if __name__ == "__main__":
    main()
