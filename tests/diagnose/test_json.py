"""Results turn into JSON only at the edge: each enumeration is written as its plain value, and a
result read back from its JSON is written the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.verdict import (
    CompareResult,
    Confidence,
    Evidence,
    OpContext,
    Outcome,
    Verdict,
)
from bisect_repro.diagnose.doctor.findings import SEVERITIES, Finding, Severity
from bisect_repro.replay.lockstep import Parted


def test_an_outcome_or_a_severity_is_given_by_member_or_by_value() -> None:
    assert (
        Evidence(experiment="replay", subject="run A", outcome="matches", detail="").outcome
        is Outcome.MATCHES
    )
    assert Finding("tf32", "warning", "seen", "fix").severity is Severity.WARNING
    with pytest.raises(ValueError):
        Evidence(experiment="replay", subject="run A", outcome="maybe", detail="")
    with pytest.raises(ValueError):
        Finding("tf32", "fatal", "seen", "fix")


def test_enumerations_are_written_as_plain_strings() -> None:
    evidence = Evidence(experiment="replay", subject="run A", outcome=Outcome.DIFFERS, detail="d")
    verdict = Verdict(
        step=2, cause=Cause.RNG_STATE, confidence=Confidence.PROVEN, evidence=[evidence]
    )
    found = verdict.to_json()
    finding = Finding("unseeded-init", Severity.ERROR, "seen", "fix").to_json()
    values = [
        found["cause"],
        found["confidence"],
        found["evidence"][0]["outcome"],
        finding["severity"],
    ]
    assert [type(v) for v in values] == [str] * 4
    assert values == ["rng_state", "proven", "differs", "error"]
    expected = (
        '{"id": "unseeded-init", "severity": "error", "layer": null, "op": null, '
        '"evidence": "seen", "fix": "fix"}'
    )
    assert json.dumps(finding) == expected


def test_severities_list_the_values_most_severe_first() -> None:
    assert SEVERITIES == ("error", "warning", "info") == tuple(s.value for s in Severity)


@pytest.mark.parametrize("name", ["reseed", "nondeterministic_op"])
def test_a_compare_object_read_back_is_written_byte_for_byte_the_same(name: str) -> None:
    """The seeding calls, where each replica parted and the ops around the first divergent op are
    typed inside the result; their JSON form is the one docs/json.md documents."""
    found = json.loads((Path(__file__).parent.parent / "report" / f"{name}.json").read_text())
    result = CompareResult.from_json(found)
    written = result.to_json()
    for path in (("verdict", "reseeded"), ("replay", "parted"), ("ops_context",), ("verdict",)):
        mine, theirs = written, found
        for key in path:
            mine, theirs = mine[key], theirs[key]
        assert json.dumps(mine) == json.dumps(theirs), path
    assert json.dumps(CompareResult.from_json(written).to_json()) == json.dumps(written)
    assert all(isinstance(row, OpContext) for row in result.ops_context) and result.ops_context
    assert result.verdict is not None and all(
        isinstance(call, SeedingCall) for call in result.verdict.reseeded
    )
    assert all(isinstance(parted, Parted) for parted in result.replay.parted)
