"""Repeating a step of an unchanged script by rewinding its replaying process, once shown faithful.

A replica whose process runs each step once (``reruns`` false) repeats a step in a fresh process,
restored and replayed to it (:mod:`bisect_repro.replay.replica`). Where its process can rewind
(an unchanged script's, :mod:`bisect_repro.serve.rewind`), the repeat runs in the same process
instead, once :func:`unfaithful` has found nothing amiss in a plain repeat on the divergent step,
that a rewind reproduces the step's first run: the same traced tensors, the same state, streams,
batch and loss after it, and what the run's records hold of the step (its batch and loss, the state
hashes of the snapshot after it). Until then, and where it does not, every repeat is a fresh
process, as before.

Which repeats a verified rewind serves:

==============================================  ===========================================
the repeat                                      runs in
==============================================  ===========================================
a step other than the verified one              a fresh process
the verified step, under its own streams        the rewound process
under other streams, streams one draw further,  the rewound process, unless the step's data
or entropy seeding fixed                        draws moved a stream (``consumes``): a fresh
                                                process draws its data under those streams
a trial of the compiler bisection               a fresh process (it compiles afresh)
==============================================  ===========================================

Where the guarantees stop: the check is made once, on one plain repeat: state the loop keeps of
its own that only a second or later repeat would expose (a count of its own calls that changes the
step from its third run on) is not caught, where a fresh process would not have it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..capture.trace import first_difference
from ..serve.protocol import StepResult
from ..store.run import Run

__all__ = ["Rewinds", "unfaithful"]


@dataclass
class Rewinds:
    """Which step a replica's process may be rewound to (see the module docstring)."""

    step: int | None = None
    """The verified step (``None``: no rewind is used)."""
    consumes: bool = False
    """The step's data draws moved a random stream."""
    refused: bool = False
    """No rewind serves the replica any more (its process cannot rewind, a rewind was not faithful,
    or a fresh process took over): its repeats are fresh processes, with spares kept ready."""
    stopped: str | None = None
    """Why a verified rewind stopped serving (a rewound run's answer was refused: the loop ended, or
    went on elsewhere than after the step's first run); the repeats from then on were fresh
    processes."""

    def serves(self, step: int, *, plain: bool, compiles: bool) -> bool:
        """Whether a repeat of ``step`` runs in the rewound process (``plain``: under the step's own
        streams)."""
        return self.step == step and not compiles and (plain or not self.consumes)


_HINT = (
    ": the loop reads state the rewind does not put back (a local counter, a batch drawn "
    "without a DataLoader)"
)


def unfaithful(
    first: StepResult, again: StepResult, run: Run, step: int, hashes: dict[str, str]
) -> str | None:
    """What a rewound run of ``step`` (the state ``hashes`` after it) did not reproduce of the
    step's first run or of the records (``None``: all of it), in words."""
    why = _differs(first, again, run, step)
    if why is None and step + 1 in run.snapshots:
        recorded = run.snapshot(step + 1)["hashes"]
        why = (
            None
            if {name: hashes.get(name) for name in recorded} == recorded
            else "did not reproduce the recorded state after it"
        )
    return None if why is None else why + _HINT


def _differs(first: StepResult, again: StepResult, run: Run, step: int) -> str | None:
    if first_difference(first.entries, again.entries) is not None or len(first.entries) != len(
        again.entries
    ):
        return "traced other tensors than its first run"
    if (first.outcome, first.streams_after) != (again.outcome, again.streams_after):
        return "ended in another state than its first run"
    recorded = run.steps.get(step) or {}
    for key, value in (("batch", again.batch), ("loss", again.loss)):
        if recorded.get(key) is not None and value is not None and recorded[key] != value:
            return f"did not reproduce the recorded {key}"
    if (first.batch, first.loss) != (again.batch, again.loss):
        return "trained on another batch, or to another loss, than its first run"
    return None
