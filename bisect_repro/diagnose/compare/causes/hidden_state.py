"""``hidden_state``: the step reads state no checkpoint holds, so it does not repeat from a restored
state.

Only a replay shows it: a run that does not repeat its own step (another path, other ops or other
Python values), or its own records, from a restored state. The parting is the proof, so it stands
where the replay parted from its records before the divergent step.
"""

from __future__ import annotations

from ...advice import hidden_state_fix
from ..signals import Signals, shown_by
from ..verdict import Outcome, Verdict
from .cause import Cause
from .entry import CauseEntry, Particulars

__all__ = ["ENTRY"]


def _holds(s: Signals, v: Verdict) -> bool:
    return shown_by(v, ("self_rerun", "replay"), Outcome.DIFFERS, one_run=True)


def _explain(p: Particulars) -> str:
    return (
        f"{p.where} differs, and the step does not repeat from the same restored state: it reads "
        "state outside what is recorded"
    )


ENTRY = CauseEntry(
    cause=Cause.HIDDEN_STATE,
    title="state outside what was recorded",
    meaning="the step reads state no checkpoint holds (a local of the running loop, an object's "
    "attribute, the clock), so it does not repeat from the restored state",
    requires="a run does not repeat its own step, or its records, from a restored state",
    holds=_holds,
    proof="the step re-run from one state taking another path, or depending on how often the "
    "code ran",
    unproven="never named without a replay",
    remedy="keep it in `Trainee(state=...)`, a module global or a closure; read "
    "`bisect_repro.current_step()` instead of counting",
    fix=lambda p: hidden_state_fix(),
    explain=_explain,
    shown_by_parting=True,
)
