"""``doctor`` and the rebuild of a run's initial state, driven through their replica factory with
fake replicas (:mod:`tests.fake_replica`): each decision tested against a program that has, or has
not, the cause it names."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.rebuild import streams_deciding_init
from bisect_repro.diagnose.compare.verdict import Confidence
from bisect_repro.diagnose.doctor.doctor import doctor
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.store.meta import CodeKind
from tests.fake_programs import one_layer, reseeding
from tests.fake_replica import Call, FakeReplica, Launcher, Outcome, Program, digest


def _hashing(call: Call) -> Outcome:
    """A step whose forward depends on the process's PYTHONHASHSEED (a set iterated)."""
    assert call.spec is not None
    return one_layer(call, forward=call.spec.variables.get("PYTHONHASHSEED"))


class _Started:
    """A replica factory for ``doctor``: a fake replica of ``program``, each one started kept."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.started: list[FakeReplica] = []

    def __call__(self, spec: LaunchSpec, label: str) -> FakeReplica:
        replica = FakeReplica(self.program, label, spec)
        self.started.append(replica)
        return replica


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A recipe TARGET whose file exists (a fake replica never runs it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.py").write_text(
        "def build(config):\n    raise SystemExit('a fake replica never runs this')\n"
    )
    return "recipe.py:build"


@pytest.mark.parametrize(
    ("step", "errors", "processes"),
    [
        (one_layer, [], 2),
        # two more processes tell string hashing from other entropy
        (_hashing, ["pythonhashseed"], 4),
        (reseeding, ["reseeded-stream:torch"], 2),
    ],
    ids=["reproducible", "string-hashing", "reseeded"],
)
def test_doctor_decides_on_fake_replicas(
    recipe: str, step: Callable[[Call], Outcome], errors: list[str], processes: int
) -> None:
    started = _Started(Program(step))
    report = doctor(recipe, steps=2, replica=started)
    assert [f.id for f in report.findings if f.severity.value == "error"] == errors
    assert report.reproducible is not errors
    assert len(started.started) == processes
    assert all(replica.closed for replica in started.started)
    assert {
        replica.spec.variables["PYTHONHASHSEED"]
        for replica in started.started
        if replica.spec is not None
    } == {"1", "2"}


def _seeded_init(width: str = "8") -> Callable[[LaunchSpec | None], Mapping[str, str]]:
    """A build whose weight is drawn from torch's global stream (numbers of ``width`` columns)."""

    def build(spec: LaunchSpec | None) -> Mapping[str, str]:
        seeds: dict[str, Any] = (spec.seeds if spec is not None else None) or {}
        return {
            "fc.weight": digest("init", seeds.get("torch"), width),
            "fc.bias": digest("zeros", width),
        }

    return build


_OS = itertools.count()  # what the OS hands a seed from entropy: never the same twice


def _from_entropy(spec: LaunchSpec | None) -> Mapping[str, str]:
    """A build that draws its weight from entropy."""
    return {"fc.weight": digest("init", next(_OS))}


SPECS = (
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/a.py"),
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/b.py"),
)


@pytest.mark.parametrize(
    ("builds", "cause", "confidence", "streams"),
    [
        ((_seeded_init(), _seeded_init()), Cause.RNG_STATE, Confidence.PROVEN, ["torch"]),
        ((_seeded_init(), _seeded_init("16")), Cause.UNKNOWN, Confidence.UNEXPLAINED, ["torch"]),
        ((_from_entropy, _from_entropy), Cause.UNKNOWN, Confidence.UNEXPLAINED, []),
    ],
    ids=["seeded-alike", "other-code", "entropy"],
)
def test_the_streams_deciding_the_initial_state_are_proven_on_fake_builds(
    builds: tuple[Callable[[LaunchSpec | None], Mapping[str, str]], ...],
    cause: Cause,
    confidence: Confidence,
    streams: list[str],
) -> None:
    launcher = Launcher(
        {
            spec.path or "": Program(one_layer, build=build)
            for spec, build in zip(SPECS, builds, strict=True)
        }
    )
    found = streams_deciding_init(SPECS, launcher)
    assert (found.cause, found.confidence, found.streams, found.reseeds) == (
        cause,
        confidence,
        streams,
        [],
    )
    assert found.evidence[0].outcome.value == (
        "differs" if builds[0] is _from_entropy else "matches"
    )
    assert all(replica.closed for replica in launcher.started)
    assert all(replica.spec is not None and replica.spec.seeds for replica in launcher.started)
