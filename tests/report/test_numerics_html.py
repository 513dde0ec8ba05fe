"""The numerics section of the HTML report: the distance against the envelope, per layer."""

from __future__ import annotations

from bisect_repro.diagnose.compare.verdict import CompareResult
from bisect_repro.diagnose.numerics.numerics import Measured, decide
from bisect_repro.diagnose.numerics.numerics_result import Distance, Envelope
from bisect_repro.report.html import comparison_html
from bisect_repro.report.numerics_html import numerics_section


def _points(values: list[float]) -> list[Distance]:
    return [Distance(step=s, relative=v, layers={"1": v, "3": v / 2}) for s, v in enumerate(values)]


def test_the_distance_and_the_envelope_are_drawn_per_layer_with_the_departure() -> None:
    envelope = Envelope(method="m", from_step=0, points=_points([0.0, 1e-8, 2e-8, 3e-8]))
    numerics = decide(Measured(_points([0.0, 1e-8, 2e-8, 1e-4])), envelope, [], None)
    html = numerics_section(numerics)
    assert (
        html.count("<svg") == 3
        and "all weights" in html
        and "layer 1" in html
        and "layer 3" in html
    )
    assert html.count('class="line diff"') == 3 and html.count('class="line b"') == 3
    assert "departs at step 3" in html and "1 snapshot(s) at distance 0 are not drawn" in html
    assert "Numerics" in comparison_html(CompareResult(runs=["a", "b"], numerics=numerics))
    assert numerics_section(None) == ""
