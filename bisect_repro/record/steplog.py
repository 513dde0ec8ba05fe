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
    """The ``steps.jsonl`` records of ``pending``: loss, order hash, batch hash, and the step's
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
        if step.step in seeded:
            record["seeded"] = seeded[step.step]
        records.append(record)
    return records
