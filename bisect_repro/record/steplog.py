"""The step lines of a recording: what each step noted, made into ``steps.jsonl`` records at the
next snapshot.

Design decisions: a step notes its batch's tensors by name (``<step>.<micro>:<path>``, hashed with
the next snapshot's, see :mod:`bisect_repro.record.session`), the name of its sample order
(``<step>:order``), its other batch leaves as text, and its loss, which stays a tensor on its
device. At the snapshot the training thread fetches the losses to the host in one transfer
(:func:`fetch_losses`), as it fetches the hashes' lanes; the records are made from them and the
digests on the writer's thread (:func:`step_records`), since that is host work on values the
training no longer changes.

Where the guarantees stop: a loss tensor is read when the snapshot is taken, not when it was
logged, so a step that changes its loss tensor in place afterwards records the changed value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.batch import combine_digests
from ..capture.rng import tree_digest

__all__ = ["PendingStep", "fetch_losses", "step_records"]


@dataclass
class PendingStep:
    """A step since the last snapshot: its batch's hash names, its order's, its other leaves, its
    loss."""

    step: int
    order_name: str | None
    batch_names: list[str]
    others: list[str]
    loss: torch.Tensor | float | None = None
    first: tuple[int, int] | None = None
    """How many of ``batch_names`` and ``others`` the step's first noted batch holds (set as the
    step notes its second)."""
    streams: dict[str, Any] | None = None
    """The random streams' states as the step's first batch was noted (a snapshot step's only): the
    point two runs pass through alike where one resumed from the other's checkpoint, which the
    snapshot's streams (taken as the step began, or at a script's first forward) are not."""
    start: dict[str, Any] | None = None
    """A script's first step only: the random streams' states as it made its last loader iterator
    before its model's first forward, before that step drew its data (its snapshot's are taken at
    the forward)."""


def fetch_losses(pending: list[PendingStep]) -> list[float | None]:
    """Every pending step's loss as a number, the tensors fetched in one transfer."""
    tensors = [p.loss for p in pending if isinstance(p.loss, torch.Tensor)]
    fetched = (
        iter(torch.stack([t.float().reshape(()) for t in tensors]).cpu().tolist())
        if tensors
        else iter(())
    )
    return [next(fetched) if isinstance(p.loss, torch.Tensor) else p.loss for p in pending]


def step_records(
    pending: list[PendingStep],
    losses: list[float | None],
    digests: Mapping[str, str],
    seeded: Mapping[int, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """The ``steps.jsonl`` records of ``pending``: loss, order hash, batch hash (and its first noted
    batch's alone, ``first``, where it noted several), the streams' digests where the step holds
    their states (``streams``; a script's first step's ``start`` too), and the step's
    entropy-seeding calls (``seeded``, by step) when it made any."""
    records = []
    for step, loss in zip(pending, losses, strict=True):
        batch_parts = [digests[name] for name in step.batch_names] + step.others
        order = digests[step.order_name] if step.order_name else None
        record: dict[str, Any] = {
            "step": step.step,
            "loss": loss,
            "order": order,
            "batch": combine_digests(batch_parts),
        }
        if step.first is not None:  # several batches: the first one's alone too
            names, others = step.first
            first = [digests[name] for name in step.batch_names[:names]] + step.others[:others]
            record["first"] = combine_digests(first)
        for key, states in (("streams", step.streams), ("start", step.start)):
            if states is not None:
                record[key] = {name: tree_digest(state) for name, state in states.items()}
        if step.step in seeded:
            record["seeded"] = seeded[step.step]
        records.append(record)
    return records
