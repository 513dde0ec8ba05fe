"""Results turn into JSON only at the edge: each enumeration is written as its plain value."""

from __future__ import annotations

import json

import pytest

from bisect_repro.diagnose.causes import Cause
from bisect_repro.diagnose.findings import SEVERITIES, Finding, Severity
from bisect_repro.diagnose.verdict import Confidence, Evidence, Outcome, Verdict


def test_an_outcome_or_a_severity_is_given_by_member_or_by_value() -> None:
    assert Evidence(experiment="replay", subject="run A", outcome="matches", detail="").outcome is Outcome.MATCHES
    assert Finding("tf32", "warning", "seen", "fix").severity is Severity.WARNING
    with pytest.raises(ValueError):
        Evidence(experiment="replay", subject="run A", outcome="maybe", detail="")
    with pytest.raises(ValueError):
        Finding("tf32", "fatal", "seen", "fix")


def test_enumerations_are_written_as_plain_strings() -> None:
    evidence = Evidence(experiment="replay", subject="run A", outcome=Outcome.DIFFERS, detail="d")
    verdict = Verdict(step=2, cause=Cause.RNG_STATE, confidence=Confidence.PROVEN, evidence=[evidence])
    found = verdict.to_json()
    finding = Finding("unseeded-init", Severity.ERROR, "seen", "fix").to_json()
    values = [found["cause"], found["confidence"], found["evidence"][0]["outcome"], finding["severity"]]
    assert [type(v) for v in values] == [str] * 4
    assert values == ["rng_state", "proven", "differs", "error"]
    expected = '{"id": "unseeded-init", "severity": "error", "layer": null, "op": null, "evidence": "seen", "fix": "fix"}'
    assert json.dumps(finding) == expected


def test_severities_list_the_values_most_severe_first() -> None:
    assert SEVERITIES == ("error", "warning", "info") == tuple(s.value for s in Severity)
