"""The experiment that proves a reseed from entropy in one run is what makes the runs part.

A replay gives each call from entropy the value its run recorded
(:mod:`bisect_repro.capture.entropy`), so a step that reseeds repeats exactly, and no experiment
that re-runs it shows it differing from itself. When the step logs show calls from entropy at the
divergent step in one run and none in the other, :func:`prove_kept` replays that run in a fresh
process from its checkpoint, each call from the divergent step on leaving its stream as it is
(``kept_from``): when the step then computes what the other run computes (its batch, every traced
tensor), the reseed is the cause, ``proven``. A call made between two steps (before a loader's
epoch) counts with the step after it, as the recorder logs it.

Where the guarantees stop: a new generator (``np.random.default_rng()``) is still made from entropy
in the experiment; a run whose step reseeds in both runs is not tried (each repeats itself with
its own recorded value, and the swaps decide).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..capture.seeding import SeedingCall
from ..capture.trace import first_difference
from ..replay.launch import LaunchSpec
from ..replay.replica import Replica
from ..serve.protocol import StepResult
from ..store.run import Run
from .causes import Cause
from .verdict import Confidence, Evidence, Verdict

__all__ = ["prove_kept", "recorded_reseeds"]


def recorded_reseeds(run: Run, step: int) -> list[dict[str, Any]]:
    """The calls from entropy ``run``'s step log shows at ``step`` (their values left out)."""
    calls = run.steps.get(step, {}).get("seeded") or []
    return [{k: v for k, v in c.items() if k != "value"} for c in calls if isinstance(c, dict) and c.get("entropy") is True]


def _kept_run(
    start: Callable[[LaunchSpec, str], Replica], spec: LaunchSpec, run: Run, checkpoint: int, step: int, label: str
) -> StepResult:
    with start(spec, label) as replica:
        replica.connect()
        replica.request("restore", run=str(run.path.resolve()), step=checkpoint, environment=run.meta.environment or {}, kept_from=step)
        replica.step = checkpoint
        replica.skip(step)
        replica.fetch()
        return replica.run(step, trace="full")


def prove_kept(
    verdict: Verdict,
    runs: tuple[Run, Run],
    specs: tuple[LaunchSpec, LaunchSpec],
    checkpoints: tuple[int, int],
    traces: tuple[StepResult, StepResult],
    start: Callable[[LaunchSpec, str], Replica],
) -> Evidence | None:
    """Where one run's step log shows reseeds at the verdict's step and the other's none: that run
    replayed with them leaving their streams as they are (see the module docstring). On a match the
    verdict becomes ``rng_state``, proven, naming the streams and the calls. The experiment's
    evidence, or ``None`` when it does not apply."""
    step = verdict.step
    calls = [recorded_reseeds(run, step) for run in runs]
    if bool(calls[0]) == bool(calls[1]):
        return None
    which = 0 if calls[0] else 1
    label, other = "AB"[which], "AB"[1 - which]
    named = ", ".join(dict.fromkeys(SeedingCall.from_json(c).describe() for c in calls[which]))
    streams = sorted({str(c.get("stream")) for c in calls[which]})
    subject = f"run {label} with {named} leaving {', '.join(streams)} as it is"
    kept = _kept_run(start, specs[which], runs[which], checkpoints[which], step, subject)
    matched = first_difference(traces[1 - which].entries, kept.entries) is None
    outcome = f"computes what run {other} computes" if matched else "still differs"
    detail = (
        f"replayed from step {checkpoints[which]} with {named} (given its recorded value, the step repeats) leaving the "
        f"stream as it is, step {step} of run {label} {outcome}"
    )
    if matched:
        verdict.cause, verdict.confidence, verdict.rng, verdict.reseeded = Cause.RNG_STATE, Confidence.PROVEN, streams, calls[which]
    return Evidence(experiment="reseed_kept", subject=subject, outcome="matches" if matched else "differs", detail=detail)
