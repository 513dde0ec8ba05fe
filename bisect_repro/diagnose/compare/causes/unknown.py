"""``unknown``: nothing the records show and no experiment explains the difference.

Always allowed; the records name it where no signal is present.
"""

from __future__ import annotations

from .cause import Cause
from .entry import CauseEntry, Particulars

__all__ = ["ENTRY"]


def _fix(p: Particulars) -> str:
    return (
        "look for state the step reads outside the model, optimizer and data (module globals, "
        "caches, time- or entropy-based values)"
    )


def _explain(p: Particulars) -> str:
    return (
        f"{p.where} differs, and neither the streams, the settings, the environment variables nor "
        "the config explain it"
    )


ENTRY = CauseEntry(
    cause=Cause.UNKNOWN,
    title="an unknown cause",
    meaning="nothing the records show and no experiment explained the difference",
    requires="nothing",
    holds=lambda s, v: True,
    proof="none",
    unproven="nothing in the records explains it",
    remedy="look for state the step reads outside the model, optimizer and data",
    fix=_fix,
    explain=_explain,
    compiler_may_explain=True,
)
