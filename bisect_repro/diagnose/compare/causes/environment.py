"""``environment``: a setting, an environment variable or a version differs.

The records name it where an environment key differs between the runs (thread counts, determinism
and TF32 switches, matmul precision, the variables that change numerics or order, library
versions, devices); a replay also names it where this machine differs from the recording's. A
replay proves it by running run B's step under run A's in-process settings, or in a fresh process
with run A's variables, the step then matching.
"""

from __future__ import annotations

from ...advice import environment_fix
from ..records import Records
from ..signals import Signals, shown_by
from ..verdict import Outcome, Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window

__all__ = ["ENTRY"]


def _environment(records: Records, w: Window) -> Finding | None:
    keys = list(records.differences.environment)
    if not keys:
        return None
    return Finding(
        cause=Cause.ENVIRONMENT,
        what=f"the environments differ ({', '.join(keys)})",
        environment_keys=keys,
    )


def _holds(s: Signals, v: Verdict) -> bool:
    return bool(s.environment) or shown_by(v, ("environment",), Outcome.DIFFERS)


def _explain(p: Particulars) -> str:
    named = ", ".join(p.environment_keys)
    matches = ", and under run A's settings run B matches" if p.proven else ""
    return f"the runs' settings differ ({named}): {p.where} differs{matches}"


ENTRY = CauseEntry(
    cause=Cause.ENVIRONMENT,
    title="the environment",
    meaning="a setting differed: thread count, determinism or TF32 switches, matmul precision, an "
    "environment variable, library versions",
    requires="an environment setting, variable or version differs",
    holds=_holds,
    proof="run B's step under run A's settings (or in a process with run A's variables) matching",
    unproven="inferred: the environments differ and nothing else the records show does",
    remedy="the setting named, the same in both runs",
    fix=lambda p: environment_fix(p.environment_keys),
    explain=_explain,
    signals=(
        RecordsSignal(
            name="environment", rank=70, when="an environment setting differs", find=_environment
        ),
    ),
    compiler_may_explain=True,
)
