"""The ``numerics`` object of ``compare --json``, typed: the distance between two runs' weights
snapshot by snapshot, the rounding envelope it is read against, and where it departs from it
(computed by :mod:`bisect_repro.diagnose.numerics.numerics` and
:mod:`bisect_repro.diagnose.numerics.envelope`).

Where the guarantees stop: these are results as computed; what each distance means, and how far it
can be trusted, is stated where it is computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..jsonform import ReadBack, plain_fields

__all__ = ["Departure", "Distance", "Envelope", "Numerics"]


@dataclass(kw_only=True)
class Distance(ReadBack):
    """The relative L2 distance of all weights at one snapshot (run B from run A, over A's norm),
    from the sketches; ``exact`` from both runs' checkpoints where both have one; ``layers`` per
    layer."""

    step: int
    relative: float
    exact: float | None = None
    layers: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return plain_fields(self, "step", "relative", "exact", "layers")


@dataclass(kw_only=True)
class Envelope:
    """How far rounding alone moves this training: run A replayed from its checkpoint at
    ``from_step`` with ``method`` changed (another thread count, a one-ulp perturbation), its
    distance from run A at each snapshot."""

    method: str
    from_step: int
    points: list[Distance] = field(default_factory=list)
    activations: list[Distance] = field(default_factory=list)
    """The same for the modules' outputs, at each step whose forward pass was sketched."""

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "from_step": self.from_step,
            "points": [p.to_json() for p in self.points],
            "activations": [p.to_json() for p in self.activations],
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> Envelope:
        points, activations = (
            [Distance.from_json(p) for p in found.get(key) or []]
            for key in ("points", "activations")
        )
        return cls(
            method=found["method"],
            from_step=found["from_step"],
            points=points,
            activations=activations,
        )


@dataclass(kw_only=True)
class Departure(ReadBack):
    """The first snapshot where the runs' distance leaves the envelope, and the layer that leaves
    it furthest there; ``cause`` names an exact signal that differs, or ``numerics``."""

    step: int
    layer: str | None
    relative: float
    envelope: float
    cause: str
    last_within: int | None = None
    """The last snapshot within the envelope before ``step``: the step that departed lies
    between."""
    departed: int | None = None
    """The training step that departed (the one that starts at snapshot ``departed``), where it is
    located below the snapshot interval: its forward pass leaves the envelope at ``layer``."""

    def to_json(self) -> dict[str, Any]:
        return plain_fields(
            self, "step", "layer", "relative", "envelope", "cause", "last_within", "departed"
        )


@dataclass(kw_only=True)
class Numerics:
    """Whether two runs differ by rounding only (the ``numerics`` object of ``compare --json``)."""

    rounding_only: bool
    departure: Departure | None = None
    distance: list[Distance] = field(default_factory=list)
    envelope: Envelope | None = None
    signals: list[str] = field(default_factory=list)
    """The exact signals that differ (sample indices, batch contents, streams, settings, config);
    empty when they agree."""
    sentence: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rounding_only": self.rounding_only,
            "departure": self.departure.to_json() if self.departure else None,
            "distance": [d.to_json() for d in self.distance],
            "envelope": self.envelope.to_json() if self.envelope else None,
            **plain_fields(self, "signals", "sentence"),
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> Numerics:
        departure, envelope = found.get("departure"), found.get("envelope")
        return cls(
            rounding_only=found["rounding_only"],
            departure=Departure.from_json(departure) if departure else None,
            distance=[Distance.from_json(d) for d in found.get("distance") or []],
            envelope=Envelope.from_json(envelope) if envelope else None,
            signals=list(found.get("signals") or []),
            sentence=found.get("sentence") or "",
        )
