"""The numerics section of the comparison report: the distance between the runs' weights against
the rounding envelope, on a log scale, for all weights and per layer.

Where the guarantees stop: a log scale has no zero, so snapshots where a distance is exactly zero
(the same initialisation, equal weights) are left out of its curve; the text says how many.
"""

from __future__ import annotations

from ..diagnose.numerics.numerics import FACTOR
from ..diagnose.numerics.numerics_result import Distance, Numerics
from .page import esc, section
from .svg import Series, line_chart

__all__ = ["numerics_section"]


def _positive(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(step, value) for step, value in points if value > 0]


def _chart(
    title: str,
    distance: list[tuple[int, float]],
    envelope: list[tuple[int, float]],
    markers: list[tuple[int, str]],
) -> str:
    limit, running = [], 0.0
    for step, value in envelope:
        running = max(running, value)
        limit.append((step, FACTOR * running))
    series = [
        Series("distance of B from A", "diff", _positive(distance)),
        Series(f"{FACTOR:g} x envelope", "b", _positive(limit)),
    ]
    return line_chart(
        [s for s in series if s.points], title=title, markers=markers, log_y=True, height=200
    )


def _layer(points: list[Distance], layer: str) -> list[tuple[int, float]]:
    return [(p.step, p.layers[layer]) for p in points if layer in p.layers]


def numerics_section(numerics: Numerics | None) -> str:
    """The section, or nothing when the comparison has no numerics."""
    if numerics is None:
        return ""
    body = f"<p>{esc(numerics.sentence)}.</p>"
    envelope = numerics.envelope.points if numerics.envelope is not None else []
    departure = numerics.departure
    markers = (
        [(departure.step, f"departs at step {departure.step}")]
        if departure is not None and departure.layer is not None
        else []
    )
    if numerics.distance:
        legend = (
            '<span><i class="diff"></i>distance of B from A</span><span><i class="b"></i>the '
            "envelope, times the factor</span>"
        )
        zeros = sum(1 for p in numerics.distance if p.relative == 0)
        body += f'<div class="legend">{legend}</div>'
        body += _chart(
            "all weights",
            [(p.step, p.relative) for p in numerics.distance],
            [(p.step, p.relative) for p in envelope],
            markers,
        )
        if zeros:
            body += (
                f'<p class="small muted">relative L2 distance (log scale); {zeros} snapshot(s) '
                "at distance 0 are not drawn.</p>"
            )
        for layer in dict.fromkeys(name for p in numerics.distance for name in p.layers):
            body += _chart(
                f"layer {layer}", _layer(numerics.distance, layer), _layer(envelope, layer), markers
            )
    return section("Numerics", body)
