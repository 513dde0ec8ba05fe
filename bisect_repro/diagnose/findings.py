"""What ``doctor`` reports: one :class:`Finding` per source of irreproducibility.

A finding is made by the experiment that proves it, and the steps that prove it further amend it
in place (``threads-unpinned`` gains its proof or drops to ``info``); it becomes the ``findings``
item of the ``bisect-repro/doctor/1`` JSON object only at the edge (:meth:`Finding.to_json`). It
lives apart from ``doctor`` because the experiments, the environment audit and the report all
make or read findings, and ``doctor`` imports them all.

Severity: ``error`` makes the recipe irreproducible on this machine, ``warning`` will bite
elsewhere (another GPU, core count or launcher), ``info`` is worth knowing; ``SEVERITIES`` is
also the order findings are listed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SEVERITIES", "Finding"]

SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    """One finding: what it is, how bad, what was seen, the fix, and where."""

    id: str
    """What it is: ``unseeded-init``, ``reseeded-stream:torch``, ``nondeterministic-op``, ..."""
    severity: str
    """One of :data:`SEVERITIES`."""
    evidence: str
    """What the experiment that proves it showed, in a sentence."""
    fix: str
    """What to change."""
    layer: str | None = None
    """The module it happens in, when it happens in one."""
    op: str | None = None
    """The aten op, when one is named."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "layer": self.layer, "op": self.op, "evidence": self.evidence, "fix": self.fix}
