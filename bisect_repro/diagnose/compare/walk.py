"""The replay of two runs, walked to the step where they part, and the experiments on that step.

:func:`walk` restores both runs from their last checkpoints at or before the last equal snapshot
(:mod:`bisect_repro.replay.lockstep`), steps them side by side to the first step where they part,
and runs the experiments there (:mod:`bisect_repro.diagnose.compare.experiments`; the compiler
bisection where one run compiled, :mod:`bisect_repro.diagnose.compare.compiled`). Runs that differ
before their first step are explained by rebuilding them
(:mod:`bisect_repro.diagnose.compare.rebuild`). A replay that parted from its records before the
divergent step downgrades what it proved, by the rules
(:func:`~bisect_repro.diagnose.compare.rules.downgrade_unfaithful`), and never places the verdict
(:func:`~bisect_repro.diagnose.compare.placement.place`).

Where the guarantees stop: the verdict returned here is not yet checked against the records;
:func:`bisect_repro.diagnose.compare.compare.compare` does that
(:func:`~bisect_repro.diagnose.compare.rules.reconcile`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...capture.rng import GLOBAL_STREAMS
from ...replay.launch import LaunchSpec
from ...replay.lockstep import Divergence, Lockstep, Parted
from ...store.run import Run
from ..causes import Cause, fix_for
from ..difference import difference_stats
from .compiled import compile_bisect
from .experiments import StepAnalysis
from .from_records import records_verdict
from .placement import closing_note, place
from .rebuild import streams_deciding_init
from .records import Records, layer_of
from .rules import downgrade_unfaithful, expected_to_part
from .verdict import CompareResult, Confidence, Evidence, Verdict

__all__ = ["Progress", "walk"]

Progress = Callable[[str, int, int], None]


def walk(
    records: Records,
    specs: tuple[LaunchSpec, LaunchSpec],
    result: CompareResult,
    progress: Progress | None,
) -> Verdict | None:
    """Both runs replayed in lockstep from their last checkpoints at or before the last equal
    snapshot to the first step where they part, then the experiments on that step: the verdict,
    placed (:mod:`~bisect_repro.diagnose.compare.placement`); ``None`` when the replay did not
    reproduce the divergence."""
    a, b = records.a, records.b
    if records.last_equal is None:
        return _init_verdict(records, specs, result)
    last_equal, end = records.last_equal, records.end
    ca, cb = _checkpoint_at(a, last_equal), _checkpoint_at(b, last_equal)
    if ca is None or cb is None:
        result.notes.append(
            f"no replay: {a.path if ca is None else b.path} has no checkpoint at or before step "
            f"{last_equal}"
        )
        return None
    fa, fb = _checkpoint_at(a, -1), _checkpoint_at(b, -1)
    # a run with a checkpoint at or before last_equal has a first one
    assert fa is not None and fb is not None
    checkpoints, first = (ca, cb), (fa, fb)
    lockstep = Lockstep((a, b), specs, progress)
    info = result.replay
    info.performed = True
    try:
        divergence = lockstep.find(checkpoints, last_equal, end, first)
        if lockstep.from_step is not None and lockstep.from_step < min(checkpoints):
            checkpoints = first
        info.from_step, info.replayed_steps = lockstep.from_step, lockstep.replayed
        verdict, entropy = None, False
        if divergence is not None:
            if progress is not None:
                progress("experimenting", 0, 1)
            verdict, entropy = _experiment(
                records, lockstep, divergence, specs, checkpoints, result
            )
        info.parted = list(lockstep.parted)
        result.notes += lockstep.notes + lockstep.stopped_rewinds()
        if divergence is None and lockstep.parted:
            verdict = _parted_verdict(records, lockstep.parted)
        expected = expected_to_part(verdict, unrecorded_data=entropy)
        unfaithful = [
            p
            for p in lockstep.parted
            if divergence is None
            or p.step < divergence.step
            or (p.step == divergence.step and not expected)
        ]
        info.faithful = not unfaithful
        if (
            verdict is not None
            and divergence is not None
            and unfaithful
            and downgrade_unfaithful(verdict)
        ):
            where = ", ".join(f"run {p.run} at step {p.step} ({p.what})" for p in unfaithful)
            result.notes.append(
                f"the replay parted from the records ({where}): the steps read state no checkpoint "
                "holds, "
                "or ran in another environment; the verdict is about the replayed runs"
            )
        # else the parting is the finding
        if (
            verdict is not None
            and divergence is not None
            and verdict.cause is not Cause.HIDDEN_STATE
        ):
            place(verdict, records, lockstep, faithful=not unfaithful)
        closing = closing_note(lockstep, verdict)
        if closing is not None:
            result.notes.append(closing)
        return verdict
    finally:
        info.seconds = round(lockstep.seconds, 3)
        lockstep.close()


def _experiment(
    records: Records,
    lockstep: Lockstep,
    divergence: Divergence,
    specs: tuple[LaunchSpec, LaunchSpec],
    checkpoints: tuple[int, int],
    result: CompareResult,
) -> tuple[Verdict, bool]:
    """The experiments on the divergent step: its verdict, and whether a run draws its data from
    entropy (it parts from its records there)."""
    lockstep.settle_repeats(divergence)
    lockstep.settle_rewinds(divergence)
    analysis = StepAnalysis(records, lockstep, divergence, specs, checkpoints)
    verdict = analysis.explain()
    result.ops_context = analysis.ops_context
    result.notes += analysis.notes
    runs = (records.a, records.b)
    found = compile_bisect(runs, lockstep.replicas, specs, divergence, checkpoints, verdict.cause)
    result.compile_bisect = found
    if found is not None:
        verdict.evidence.append(Evidence(**found.evidence()))
        verdict.fix = "; ".join(filter(None, (verdict.fix, found.fix)))
    return verdict, analysis.unrecorded_data


def _checkpoint_at(run: Run, step: int) -> int | None:
    """The checkpoint a replay of ``run`` starts from: the last at or before ``step`` (``-1``: the
    first); a framework's run replays from its own start, whatever its checkpoints."""
    options = run.meta.options
    if options.replay == "from_start":
        start = options.start_step
        return start if start <= step or step < 0 else None
    if step < 0:
        return min(run.checkpoints, default=None)
    return max((s for s in run.checkpoints if s <= step), default=None)


def _parted_verdict(records: Records, parted: list[Parted]) -> Verdict:
    """The replay reproduced neither its records nor the divergence (it parted while
    fast-forwarding)."""
    verdict = records_verdict(records)
    first = min(parted, key=lambda p: p.step)
    detail = (
        f"restored from its checkpoint with every recorded stream and setting, run {first.run} "
        "does not reproduce its own "
        f"recorded {first.what} at step {first.step}"
    )
    verdict.evidence.append(
        Evidence(experiment="replay", subject=f"run {first.run}", outcome="differs", detail=detail)
    )
    verdict.explanation = (
        f"{detail}: the steps read state that no checkpoint holds (a counter in a closure, a "
        "global, the clock), "
        f"or a nondeterministic kernel; {verdict.explanation}"
    )
    if verdict.cause is Cause.UNKNOWN:
        verdict.cause, verdict.fix = Cause.HIDDEN_STATE, fix_for(Cause.HIDDEN_STATE)
    return verdict


def _init_verdict(
    records: Records, specs: tuple[LaunchSpec, LaunchSpec], result: CompareResult
) -> Verdict:
    row = records.timeline[0]
    tensor = row.first_tensor
    verdict = Verdict(
        step=row.step, phase="init", tensor=tensor, layer=layer_of(tensor) if tensor else None
    )
    a, b = records.a, records.b
    if row.step in a.checkpoints and row.step in b.checkpoints and tensor is not None:
        # a name the checkpoints' models may not hold (a wrapper's): then no statistics
        values = [run.checkpoint(row.step).get("model", {}).get(tensor) for run in (a, b)]
        if all(isinstance(value, torch.Tensor) for value in values):
            verdict.set_difference(difference_stats(*values))
    resumed = b.meta.options.resumed_from is not None
    found = streams_deciding_init(specs)
    result.replay.performed = True
    verdict.cause, verdict.confidence, verdict.rng, verdict.reseeded = (
        found.cause,
        found.confidence,
        found.streams,
        found.reseeds,
    )
    verdict.evidence = found.evidence
    if found.cause is Cause.RNG_STATE:
        verdict.explanation = (
            f"the runs start from different states ({tensor} differs at step {row.step}): the "
            "initialisation draws from "
            f"{', '.join(found.streams)}, which "
            f"{'were reseeded from entropy' if found.reseeds else 'were not seeded alike'}"
        )
    else:
        verdict.explanation = (
            f"{tensor} differs at step {row.step}, and building the code again "
            "with every global stream fixed does not explain it"
        )
        if records.config_diff:
            verdict.cause, verdict.config_keys, verdict.confidence = (
                Cause.CONFIG,
                list(records.config_diff),
                Confidence.PROVEN if found.settings_decide else Confidence.INFERRED,
            )
            # the streams the settings left in other states at the first snapshot
            verdict.rng = found.streams or [s for s in row.streams if s in GLOBAL_STREAMS]
            verdict.explanation = (
                f"{tensor} differs at step {row.step}: the runs were built with different "
                f"settings ({', '.join(records.config_diff)})"
                + (", and run B built with run A's matches" if found.settings_decide else "")
                + (f"; {', '.join(verdict.rng)} differ there" if verdict.rng else "")
            )
        elif records.environment_diff:
            verdict.cause, verdict.environment_keys, verdict.confidence = (
                Cause.ENVIRONMENT,
                list(records.environment_diff),
                Confidence.INFERRED,
            )
    verdict.fix = fix_for(
        verdict.cause,
        streams=verdict.rng,
        reseeds=found.reseeds,
        resumed=resumed,
        keys=verdict.environment_keys,
        config=records.config_diff,
    )
    return verdict
