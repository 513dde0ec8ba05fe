"""What ``doctor`` learns from building and training a recipe in one process, and what two such
processes disagree on.

:func:`probe` drives a :class:`~bisect_repro.replay.replica.Replica` of the recipe (a fresh
process, with a chosen ``PYTHONHASHSEED``) through its first steps and gathers, right after the
build, a content hash of every parameter and buffer, a digest of every random stream (the global
ones, the loader's generators, the recipe's ``generators`` and the streams found inside the
dataset and sampler), the environment fingerprint and whether the recipe pinned the thread
count; then, for each step, the batch's sample indices, content hash, the workers' base seed and
the loss; and the hashes of the whole state after those steps. :func:`differences` is what two
such objects disagree on: exactly where the recipe is not reproducible across processes.

The replica keeps the state each step started from, so that ``doctor``'s experiments can run
those steps again in the same process (see :mod:`bisect_repro.diagnose.checks`).
"""

from __future__ import annotations

from typing import Any

from ..replay.replica import Replica
from ..serve.protocol import StepResult

__all__ = ["differences", "probe"]


def probe(replica: Replica, steps: int, *, keep: bool = False) -> tuple[dict[str, Any], list[StepResult]]:
    """The probe object of a freshly connected replica (see the module docstring), and each
    step's untraced result; ``keep`` keeps every step's start in the replica, to run again."""
    described = replica.describe().to_json()
    kept = ("init", "streams", "hidden", "environment", "threads_set", "loader", "convolutions")
    result: dict[str, Any] = {key: described[key] for key in kept}
    result["batches"] = []
    outcomes = []
    for step in range(steps):
        fetched = replica.fetch(keep=list(range(step)) if keep else [])
        outcome = replica.run(step, trace="none", commit=True)
        outcomes.append(outcome)
        result["batches"].append(
            {"indices": fetched.indices, "content": fetched.batch, "base_seed": fetched.base_seed, "loss": outcome.loss}
        )
    result["final"] = replica.hashes()
    return result, outcomes


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
