"""``structure``: the models differ in their parameters or buffers (name, shape or dtype).

Named only from the recorded model structures, before anything else is compared
(:func:`~bisect_repro.diagnose.compare.from_records.structure_verdict`): no records signal and no
replay.
"""

from __future__ import annotations

from .cause import Cause
from .entry import CauseEntry, Particulars

__all__ = ["ENTRY"]


def _fix(p: Particulars) -> str:
    settings = p.differences.config
    differ = f" (the settings differ: {', '.join(settings)})" if settings else ""
    return f"compare runs of the same model: the same code, settings and versions{differ}"


ENTRY = CauseEntry(
    cause=Cause.STRUCTURE,
    title="the model structure",
    meaning="the models' parameters or buffers differ in name, shape or dtype",
    requires="a parameter or buffer differs in name, shape or dtype",
    holds=lambda s, v: s.structure is not None,
    proof="the recorded model structures",
    unproven="always shown by the records",
    remedy="compare runs of the same model",
    fix=_fix,
    explain=lambda p: f"the models differ in structure: {p.where}",
)
