"""``nondeterministic_op``: an op gives other outputs on identical inputs, so a run differs from
itself.

Only a replay shows it: pairs of re-runs of one step from one state in which an op gives other
outputs on identical inputs. A faithful replay may not reproduce its own records at that step.
"""

from __future__ import annotations

from ...advice import environment_fix, op_fix
from ..signals import Signals, shown_by
from ..verdict import Outcome, Verdict
from .cause import Cause
from .entry import CauseEntry, Particulars

__all__ = ["ENTRY"]


def _holds(s: Signals, v: Verdict) -> bool:
    return shown_by(v, ("self_rerun", "op_trace"), Outcome.DIFFERS, one_run=True)


def _fix(p: Particulars) -> str:
    """The op's fix, after the determinism settings that differ between the runs (if any)."""
    fix = op_fix(p.op)
    return f"{environment_fix(p.environment_keys)}; {fix}" if p.environment_keys else fix


def _explain(p: Particulars) -> str:
    return (
        f"the run differs from itself when replayed: {p.where} gives different results on "
        "identical inputs"
    )


ENTRY = CauseEntry(
    cause=Cause.NONDETERMINISTIC_OP,
    title="a nondeterministic op",
    meaning="the run differs from itself: atomic adds in `index_put_`/`index_add`/scatter, conv "
    "and pooling backward on CUDA, a kernel picked by timing",
    requires="a run differs from itself: the same step from the same state gives other results",
    holds=_holds,
    proof="pairs of re-runs from one state in which an op gives other outputs on identical inputs",
    unproven="never named without a replay",
    remedy="`torch.use_deterministic_algorithms(True)`, `CUBLAS_WORKSPACE_CONFIG=:4096:8`, "
    "`cudnn.deterministic = True`, `cudnn.benchmark = False`",
    fix=_fix,
    explain=_explain,
    parts_from_records=True,
)
