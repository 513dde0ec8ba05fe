"""``resume``: a run resumed from a checkpoint that did not restore part of the training state the
other run held there (an optimizer's state or settings, a scheduler, a scaler, an EMA copy).

The records name it from the resume audit (:mod:`~bisect_repro.diagnose.compare.resume`): the
resumed run starts from the other's model at a step where an optimizer's state, or the recipe's
other state, hashes otherwise in the two runs, and the runs part at or after that step. A random
stream or the data position the resume missed is named by its own cause (``rng_state``,
``data_order``), which acts before the update does.

Where the guarantees stop: no experiment loads one run's optimizer state into the other's resumed
step, so the cause is ``inferred``, from the hashes of both states at the resume; a part the run
did not record (an object of the script's own) is not audited.
"""

from __future__ import annotations

from ...advice import resume_fix
from ..records import Records
from ..signals import Signals, at_or_before
from ..verdict import Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window

__all__ = ["ENTRY"]


def _unrestored(records: Records, w: Window) -> Finding | None:
    resume = records.resume
    missing = resume.state_missing if resume is not None else []
    if resume is None or not missing or w.end < resume.step:
        return None
    other = "A" if resume.run == "B" else "B"
    what = (
        f"run {resume.run} resumed at step {resume.step} without the state run {other} held "
        f"there: {', '.join(missing)}"
    )
    # an optimizer's state is first read by the resume step's own update
    if any(part.startswith("optimizer") for part in missing):
        return Finding(cause=Cause.RESUME, what=what, step=resume.step, phase="optimizer")
    return Finding(cause=Cause.RESUME, what=what)


def _holds(s: Signals, v: Verdict) -> bool:
    return bool(s.unrestored) and at_or_before(s.resumed, v)


def _explain(p: Particulars) -> str:
    return (
        f"the resume did not restore {', '.join(p.unrestored) or 'the training state'}, so the "
        f"step after it computes from another state: {p.where} differs"
    )


ENTRY = CauseEntry(
    cause=Cause.RESUME,
    title="a resume that did not restore the training state",
    meaning="a run resumed from a checkpoint without part of the state the other run held there "
    "(an optimizer's state or settings, a scheduler, a scaler, an EMA copy)",
    requires="the resume audit names an optimizer's state or other training state the resumed "
    "run did not restore, at or before the step",
    holds=_holds,
    proof="none: no experiment loads one run's optimizer state into the other's resumed step",
    unproven="inferred from the hashes of both runs' state at the resume step",
    remedy="save each part named in the checkpoint and load it on resume "
    "(`optimizer.state_dict()` / `load_state_dict()`, the scheduler's, the scaler's)",
    fix=lambda p: resume_fix(p.unrestored),
    explain=_explain,
    signals=(
        RecordsSignal(
            name="unrestored",
            rank=52,
            when="one run resumed at or before the divergence without an optimizer's state or "
            "other training state the other held there",
            find=_unrestored,
        ),
    ),
)
