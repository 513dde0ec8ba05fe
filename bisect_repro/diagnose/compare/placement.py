"""Where a verdict's location comes from: a replay that matched the records, or the records alone.

The location of a divergence (step, phase, layer, tensor, op) is taken from the replay only when
the replay reproduced both runs' records up to the divergent step: from the checkpoints, from the
runs' first checkpoints when the first walk parted
(:meth:`~bisect_repro.replay.lockstep.Lockstep.find`), with each repeat of the step in a fresh
process where a repeat in one process is not the run
(:meth:`~bisect_repro.replay.lockstep.Lockstep.settle_repeats`). Where the replay parted from its
records before the divergent step, it is not the run, and the location is the records' alone. The
verdict's evidence says which (``location``).

=======================================  ==================================================
the replay                               the location
=======================================  ==================================================
matched the records up to the step       the replay's (full traces of the step)
parted from them before (unfaithful)     the records' (the step, and the pass where they show it)
=======================================  ==================================================

The closing note lists each walk of the replay: where it started, the steps it replayed, whether
it matched the records, and what it yielded (the verdict, or nothing).

Where the guarantees stop: the records locate a divergence only to the step (and to the data,
where the batch logs differ), never to a layer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...replay.lockstep import Attempt, Lockstep
from .verdict import DIFFERENCE_FIELDS, Evidence, Verdict

__all__ = ["closing_note", "place"]

_LOCATION = ("step", "phase", "layer", "tensor", "op")


def place(verdict: Verdict, named: Verdict, lockstep: Lockstep, *, faithful: bool) -> Verdict:
    """The verdict with the replay's location when it was ``faithful`` up to the divergent step,
    else with the records' (``named``: the records' verdict); its evidence says which."""
    if faithful:
        start = lockstep.from_step
        detail = (
            f"located by a replay from step {start} that reproduced both runs' records up to "
            f"step {verdict.step}"
        )
        located = Evidence(
            experiment="location", subject="the replay", outcome="matches", detail=detail
        )
        return replace(verdict, evidence=[*verdict.evidence, located])
    detail = (
        "located by the records alone: the replay parted from its records before the "
        "divergent step, so it is not the run"
    )
    located = Evidence(
        experiment="location", subject="the records", outcome="inconclusive", detail=detail
    )
    located_by: dict[str, Any] = {key: getattr(named, key) for key in _LOCATION}
    located_by.update(dict.fromkeys(DIFFERENCE_FIELDS))  # the records measure no tensor
    return replace(verdict, **located_by, evidence=[*verdict.evidence, located])


def _walk(attempt: Attempt, final: str, last: bool) -> str:
    start = "/".join(map(str, attempt.checkpoints))
    head = f"from the checkpoints at steps {start}, {attempt.replayed} step(s) replayed"
    if attempt.parted and (
        not last or any(p.step < (attempt.divergent or 0) for p in attempt.parted)
    ):
        where = ", ".join(f"run {p.run} at step {p.step} ({p.what})" for p in attempt.parted)
        return f"{head}, parted from the records ({where}): no verdict taken from it"
    return f"{head}, matched the records: {final}"


def closing_note(lockstep: Lockstep, verdict: Verdict | None) -> str | None:
    """Each walk of the replay with what it yielded, where there was more than one."""
    attempts = lockstep.attempts
    if len(attempts) < 2:
        return None
    final = (
        "no divergence"
        if verdict is None
        else f"step {verdict.step}, {verdict.cause.value}, {verdict.confidence.value}"
    )
    walks = "; ".join(_walk(a, final, i == len(attempts) - 1) for i, a in enumerate(attempts))
    return f"the replays: {walks}"
