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
those steps again in the same process (see :mod:`bisect_repro.diagnose.doctor.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...replay.interface import ReplicaLike
from ...serve.protocol import Description, StepResult

__all__ = ["Probe", "ProbeDifferences", "ProbedBatch", "differences", "probe"]


@dataclass(frozen=True, kw_only=True)
class ProbedBatch:
    """One step's batch and loss in a probed process."""

    indices: list[int] | None
    content: str | None
    """The batch's digest."""
    base_seed: int | None
    """The loader's base seed for its workers."""
    loss: float | None


@dataclass(frozen=True, kw_only=True)
class Probe:
    """What one process built and trained (see the module docstring)."""

    built: Description
    """The process right after the build: its state, streams, hidden streams, environment."""
    batches: list[ProbedBatch]
    final: dict[str, str]
    """The hash of every tensor after the steps."""


@dataclass(frozen=True, kw_only=True)
class ProbeDifferences:
    """What two probes disagree on: names, or the first batch that differs (``None``: none)."""

    init: list[str]
    streams: list[str]
    hidden: list[str]
    order: int | None
    content: int | None
    """The first batch whose content differs while its sample indices agree."""
    base_seed: int | None
    loss: int | None
    final: list[str]

    @property
    def none(self) -> bool:
        """Nothing that matters differs: the state before and after, the data and the losses."""
        return (
            not self.init
            and not self.final
            and self.order is None
            and self.content is None
            and self.loss is None
        )


def probe(
    replica: ReplicaLike, steps: int, *, keep: bool = False
) -> tuple[Probe, list[StepResult]]:
    """The probe of a freshly connected replica (see the module docstring), and each step's
    untraced result; ``keep`` keeps every step's start in the replica, to run again."""
    built = replica.describe()
    batches, outcomes = [], []
    for step in range(steps):
        fetched = replica.fetch(keep=list(range(step)) if keep else [])
        outcome = replica.run(step, trace="none", commit=True)
        outcomes.append(outcome)
        batches.append(
            ProbedBatch(
                indices=fetched.indices,
                content=fetched.batch,
                base_seed=fetched.base_seed,
                loss=outcome.loss,
            )
        )
    return Probe(built=built, batches=batches, final=replica.hashes()), outcomes


def _first_batch(a: Probe, b: Probe, key: str, *, same_indices: bool = False) -> int | None:
    for index, (x, y) in enumerate(zip(a.batches, b.batches, strict=False)):
        if (not same_indices or x.indices == y.indices) and getattr(x, key) != getattr(y, key):
            return index
    return None


def _names(a: dict[str, object], b: dict[str, object]) -> list[str]:
    return [n for n in a if n in b and a[n] != b[n]]


def differences(a: Probe, b: Probe) -> ProbeDifferences:
    """What differs between two probes."""
    return ProbeDifferences(
        init=_names(dict(a.built.init), dict(b.built.init)),
        streams=_names(dict(a.built.streams), dict(b.built.streams)),
        hidden=_names(dict(a.built.hidden), dict(b.built.hidden)),
        order=_first_batch(a, b, "indices"),
        content=_first_batch(a, b, "content", same_indices=True),
        base_seed=_first_batch(a, b, "base_seed"),
        loss=_first_batch(a, b, "loss"),
        final=_names(dict(a.final), dict(b.final)),
    )
