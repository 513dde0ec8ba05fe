"""What ``doctor`` reports: one :class:`Finding` per source of irreproducibility.

A finding is made by the experiment that proves it, and the steps that prove it further amend it
in place (``threads-unpinned`` gains its proof or drops to ``info``); it becomes the ``findings``
item of the ``bisect-repro/doctor/1`` JSON object only at the edge (:meth:`Finding.to_json`). It
lives apart from ``doctor`` because the experiments, the environment audit and the report all
make or read findings, and ``doctor`` imports them all.

Severity (:class:`Severity`): ``error`` makes the recipe irreproducible on this machine,
``warning`` will bite elsewhere (another GPU, core count or launcher), ``info`` is worth knowing;
their order is also the order findings are listed in (``SEVERITIES``, their values).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["SEVERITIES", "Finding", "Severity"]


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


SEVERITIES = tuple(severity.value for severity in Severity)
"""The severities' values, most severe first: the order findings are listed in."""


@dataclass(init=False)
class Finding:
    """One finding: what it is, how bad, what was seen, the fix, and where."""

    id: str
    """What it is: ``unseeded-init``, ``reseeded-stream:torch``, ``nondeterministic-op``, ..."""
    severity: Severity
    """How bad it is."""
    evidence: str
    """What the experiment that proves it showed, in a sentence."""
    fix: str
    """What to change."""
    layer: str | None = None
    """The module it happens in, when it happens in one."""
    op: str | None = None
    """The aten op, when one is named."""

    def __init__(
        self,
        id: str,
        severity: Severity | str,
        evidence: str,
        fix: str,
        layer: str | None = None,
        op: str | None = None,
    ) -> None:
        """``severity`` may be given by its value (``"error"``); an unknown one raises
        ``ValueError``."""
        self.id, self.severity, self.evidence, self.fix, self.layer, self.op = (
            id,
            Severity(severity),
            evidence,
            fix,
            layer,
            op,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "layer": self.layer,
            "op": self.op,
            "evidence": self.evidence,
            "fix": self.fix,
        }
