"""``code``: the runs ran different source code (the script's, the module's or the recipe file's
SHA-256 differs).

The records name it from the code each run recorded with its hash
(:attr:`~bisect_repro.diagnose.compare.differences.Differences.code`), before the config: a script
edited between two runs is the first thing to look at, whatever its flags. Where both files are on
this machine and still hash as recorded, the verdict shows the first lines where they differ.

Where the guarantees stop: no experiment runs one run's step with the other's code, so the cause
is never ``proven``, only ``inferred``; a replay that proves another cause (run B relaunched with
run A's arguments, matching) is kept. Only the main file is hashed, not the modules it imports.
"""

from __future__ import annotations

from ..records import Records
from ..signals import Signals
from ..verdict import Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window

__all__ = ["ENTRY"]


def _code(records: Records, w: Window) -> Finding | None:
    code = records.differences.code
    if not code:
        return None
    shown = "; ".join(f"{c.describe()}, {c.lines_described()}" for c in code)
    return Finding(cause=Cause.CODE, what=f"the runs ran different code: {shown}")


def _holds(s: Signals, v: Verdict) -> bool:
    return bool(s.code)


def _fix(p: Particulars) -> str:
    files = "; ".join(f"{c.describe()}, {c.lines_described()}" for c in p.differences.code)
    return f"run both from the same code ({files or 'the code file differs'})"


def _explain(p: Particulars) -> str:
    names = ", ".join(c.name for c in p.differences.code) or "the code"
    return f"the runs ran different code ({names}): {p.where} differs"


ENTRY = CauseEntry(
    cause=Cause.CODE,
    title="different source code",
    meaning="the runs ran different source code: the script's, the module's or the recipe file's "
    "SHA-256 differs",
    requires="the script's, the module's or the recipe file's SHA-256 differs between the runs",
    holds=_holds,
    proof="none: no experiment runs one run's step with the other's code",
    unproven="inferred from the recorded SHA-256 of each run's code, with the first lines that "
    "differ where both files are here as recorded",
    remedy="the same code in both runs: the file named, with its first differing lines",
    fix=_fix,
    explain=_explain,
    signals=(
        RecordsSignal(
            name="code",
            rank=55,
            when="the script's, the module's or the recipe file's SHA-256 differs",
            find=_code,
        ),
    ),
)
