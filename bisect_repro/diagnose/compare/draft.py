"""What the experiments on one divergent step have found so far: a :class:`Draft`, changed as each
experiment runs, made into a :class:`~bisect_repro.diagnose.compare.verdict.Verdict` once at the
end (:meth:`Draft.verdict`).

Where the guarantees stop: a draft is the experiments' working state and is never reported; only
the verdict made from it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...capture.seeding import SeedingCall
from .causes import Cause
from .verdict import DIFFERENCE_FIELDS, Confidence, Evidence, Verdict

__all__ = ["Draft"]


@dataclass(kw_only=True)
class Draft:
    """Where the step first differs, and the cause the experiments have shown so far."""

    step: int
    phase: str | None = None
    layer: str | None = None
    tensor: str | None = None
    op: str | None = None
    rank: int | None = None
    cause: Cause = Cause.UNKNOWN
    confidence: Confidence = Confidence.INFERRED
    rng: list[str] = field(default_factory=list)
    reseeded: list[SeedingCall] = field(default_factory=list)
    config_keys: list[str] = field(default_factory=list)
    environment_keys: list[str] = field(default_factory=list)
    difference: dict[str, Any] = field(default_factory=dict)
    """The size of the first divergent tensor's difference (the keys of
    :data:`~bisect_repro.diagnose.compare.verdict.DIFFERENCE_FIELDS`)."""

    def set_difference(self, stats: Mapping[str, Any]) -> None:
        self.difference = {k: stats[k] for k in DIFFERENCE_FIELDS if k in stats}

    @property
    def fraction_differing(self) -> float | None:
        value = self.difference.get("fraction_differing")
        return None if value is None else float(value)

    def verdict(self, *, explanation: str, fix: str, evidence: list[Evidence]) -> Verdict:
        """The verdict, made whole."""
        return Verdict(
            step=self.step,
            phase=self.phase,
            layer=self.layer,
            tensor=self.tensor,
            op=self.op,
            rank=self.rank,
            cause=self.cause,
            confidence=self.confidence,
            rng=list(self.rng),
            reseeded=list(self.reseeded),
            config_keys=list(self.config_keys),
            environment_keys=list(self.environment_keys),
            explanation=explanation,
            fix=fix,
            evidence=list(evidence),
            **self.difference,
        )
