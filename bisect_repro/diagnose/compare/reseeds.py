"""The experiment that proves a reseed from entropy in one run is what makes the runs part.

A replay gives each call from entropy the value its run recorded
(:mod:`bisect_repro.capture.entropy`), so a step that reseeds repeats exactly, and no experiment
that re-runs it shows it differing from itself. When the step logs show calls from entropy at the
divergent step, :func:`prove_kept` replays each run that made them in a fresh process from its
checkpoint (or rewinds its replaying process to the step, where a verified rewind serves it,
:mod:`bisect_repro.replay.rewind`), each call from the divergent step on leaving its stream as it
is (``kept_from``, ``kept_entropy``): when
the two runs then compute the same at the step (the batch, every traced tensor), the reseeds are
the cause, ``proven``. A call made between two steps (before a loader's
epoch) counts with the step after it, as the recorder logs it.

Where the guarantees stop: a new generator (``np.random.default_rng()``) is still made from entropy
in the experiment, so a step that draws from one made there still differs.
"""

from __future__ import annotations

from ...capture.seeding import SeedingCall
from ...capture.trace import first_difference
from ...replay.interface import ReplicaFactory, ReplicaLike
from ...replay.launch import LaunchSpec
from ...serve.protocol import StepResult
from ...store.run import Run
from .causes import Cause
from .draft import Draft
from .verdict import Confidence, Evidence

__all__ = ["prove_kept", "recorded_reseeds"]


def recorded_reseeds(run: Run, step: int) -> list[SeedingCall]:
    """The calls from entropy ``run``'s step log shows at ``step`` (their values left out)."""
    calls = run.steps.get(step, {}).get("seeded") or []
    return [
        SeedingCall.from_json(c) for c in calls if isinstance(c, dict) and c.get("entropy") is True
    ]


def _kept_run(
    start: ReplicaFactory,
    spec: LaunchSpec,
    run: Run,
    checkpoint: int,
    step: int,
    label: str,
    rewound: ReplicaLike | None,
) -> StepResult:
    # the same run, in the replay's process
    if rewound is not None and rewound.rewinds.serves(step, plain=False, compiles=False):
        return rewound.run(step, trace="full", kept_entropy=True)
    with start(spec, label) as replica:
        replica.connect()
        replica.restore(run.path, checkpoint, run.meta.environment, kept_from=step)
        replica.skip(step)
        replica.fetch()
        return replica.run(step, trace="full")


def prove_kept(
    verdict: Draft,
    runs: tuple[Run, Run],
    specs: tuple[LaunchSpec, LaunchSpec],
    checkpoints: tuple[int, int],
    traces: tuple[StepResult, StepResult],
    start: ReplicaFactory,
    replicas: tuple[ReplicaLike, ReplicaLike] | None = None,
) -> Evidence | None:
    """Where a run's step log shows reseeds at the verdict's step: each such run replayed with them
    leaving their streams as they are (see the module docstring), against the other as replayed.
    On a match the verdict becomes ``rng_state``, proven, naming the streams and the calls. The
    experiment's evidence, or ``None`` when no step log shows a reseed there. ``replicas``: the
    replay's, whose verified rewind of the step runs the experiment in place of a fresh process."""
    step = verdict.step
    calls = [recorded_reseeds(run, step) for run in runs]
    if not calls[0] and not calls[1]:
        return None
    reseeding = [label for label, found in zip("AB", calls, strict=True) if found]
    every = [c for found in calls for c in found]
    named = ", ".join(dict.fromkeys(c.describe() for c in every))
    streams = sorted({c.stream for c in every})
    subject = (
        f"run {' and run '.join(reseeding)} with {named} leaving {', '.join(streams)} as it is"
    )
    kept = [
        _kept_run(
            start,
            specs[i],
            runs[i],
            checkpoints[i],
            step,
            f"run {'AB'[i]} with its reseeds kept",
            replicas and replicas[i],
        )
        if calls[i]
        else traces[i]
        for i in (0, 1)
    ]
    matched = first_difference(kept[0].entries, kept[1].entries) is None
    outcome = "the runs compute the same" if matched else "the runs still differ"
    detail = (
        f"replayed from the checkpoint with {named} (given its recorded value, the step repeats) "
        "leaving the stream as it is, "
        f"at step {step} {outcome}"
    )
    if matched:
        verdict.cause, verdict.confidence, verdict.rng, verdict.reseeded = (
            Cause.RNG_STATE,
            Confidence.PROVEN,
            streams,
            every,
        )
    return Evidence(
        experiment="reseed_kept",
        subject=subject,
        outcome="matches" if matched else "differs",
        detail=detail,
    )
