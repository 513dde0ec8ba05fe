"""The replay of two runs, walked to the step where they part, and the experiments on that step.

:func:`walk` restores both runs from their last checkpoints at or before the last equal snapshot
(:mod:`bisect_repro.replay.lockstep`), steps them side by side to the first step where they part,
and runs the experiments there (:mod:`bisect_repro.diagnose.compare.experiments`; the compiler
bisection where one run compiled, :mod:`bisect_repro.diagnose.compare.compiled`). Runs that differ
before their first step are explained by rebuilding them
(:mod:`bisect_repro.diagnose.compare.rebuild`). A replay that parted from its records before the
divergent step downgrades what it proved, by the rules
(:func:`~bisect_repro.diagnose.compare.rules.about_the_replayed_runs`), and never places the
verdict (:func:`~bisect_repro.diagnose.compare.placement.place`). The records' verdict, made once by
``compare``, is handed in: it places a verdict the replay cannot, and names the cause where the
replay parted while fast-forwarding or where a rebuild explains nothing.

Where the guarantees stop: the verdict returned here is not yet checked against the records;
:func:`bisect_repro.diagnose.compare.compare.compare` does that
(:func:`~bisect_repro.diagnose.compare.rules.reconcile`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ...capture.rng import GLOBAL_STREAMS
from ...replay.launch import LaunchSpec
from ...replay.lockstep import Divergence, Lockstep, Parted
from ...store.run import Run
from ..advice import hidden_state_fix
from ..difference import difference_stats
from ..stages import timed
from .causes import Cause
from .causes.entry import Particulars
from .causes.registry import REGISTRY, explanation_for, fix_for
from .compiled import compile_bisect
from .experiments import StepAnalysis
from .placement import closing_note, place
from .rebuild import InitStreams, streams_deciding_init
from .records import Records, layer_of
from .rules import about_the_replayed_runs, expected_to_part
from .verdict import CompareResult, Confidence, Evidence, Verdict

__all__ = ["Progress", "walk"]

Progress = Callable[[str, int, int], None]


def walk(
    records: Records,
    named: Verdict,
    specs: tuple[LaunchSpec, LaunchSpec],
    result: CompareResult,
    progress: Progress | None,
) -> Verdict | None:
    """Both runs replayed in lockstep from their last checkpoints at or before the last equal
    snapshot to the first step where they part, then the experiments on that step: the verdict,
    placed (:mod:`~bisect_repro.diagnose.compare.placement`); ``None`` when the replay did not
    reproduce the divergence. ``named``: the records' verdict."""
    a, b = records.a, records.b
    if records.last_equal is None:
        return _init_verdict(records, named, specs, result)
    last_equal = records.last_equal
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
    with timed("launch"):
        lockstep = Lockstep((a, b), specs, progress)
    result.replay.performed = True
    try:
        return _walked(records, named, lockstep, specs, ((ca, cb), (fa, fb)), result, progress)
    finally:
        result.replay.seconds = round(lockstep.seconds, 3)
        lockstep.close()


def _walked(
    records: Records,
    named: Verdict,
    lockstep: Lockstep,
    specs: tuple[LaunchSpec, LaunchSpec],
    starts: tuple[tuple[int, int], tuple[int, int]],
    result: CompareResult,
    progress: Progress | None,
) -> Verdict | None:
    """The lockstep to the divergent step, the experiments there, and the verdict judged by how
    faithful the replay was."""
    info, (checkpoints, first) = result.replay, starts
    assert records.last_equal is not None
    with timed("replay to the divergent step"):
        divergence = lockstep.find(checkpoints, records.last_equal, records.end, first)
    if lockstep.from_step is not None and lockstep.from_step < min(checkpoints):
        checkpoints = first
    info.from_step, info.replayed_steps = lockstep.from_step, lockstep.replayed
    verdict, entropy = None, False
    if divergence is not None:
        if progress is not None:
            progress("experimenting", 0, 1)
        with timed("experiments"):
            verdict, entropy = _experiment(
                records, lockstep, divergence, specs, checkpoints, result
            )
    info.parted = list(lockstep.parted)
    result.notes += lockstep.notes + lockstep.stopped_rewinds()
    if divergence is None and lockstep.parted:
        verdict = _parted_verdict(named, lockstep.parted)
    expected = expected_to_part(verdict, unrecorded_data=entropy)
    unfaithful = [
        p
        for p in lockstep.parted
        if divergence is None
        or p.step < divergence.step
        or (p.step == divergence.step and not expected)
    ]
    info.faithful = not unfaithful
    if verdict is not None and divergence is not None:
        verdict = _judged(verdict, named, lockstep, unfaithful, result)
    closing = closing_note(lockstep, verdict)
    if closing is not None:
        result.notes.append(closing)
    return verdict


def _judged(
    verdict: Verdict,
    named: Verdict,
    lockstep: Lockstep,
    unfaithful: list[Parted],
    result: CompareResult,
) -> Verdict:
    """A replayed verdict lowered where the replay parted from its records before the divergent
    step, and placed (:func:`~bisect_repro.diagnose.compare.placement.place`), unless the parting
    is its cause's own proof (then the parting is the finding)."""
    if REGISTRY[verdict.cause].shown_by_parting:
        return verdict
    if unfaithful:
        lowered = about_the_replayed_runs(verdict)
        if lowered is not None:
            verdict = lowered
            where = ", ".join(f"run {p.run} at step {p.step} ({p.what})" for p in unfaithful)
            result.notes.append(
                f"the replay parted from the records ({where}): the steps read state no checkpoint "
                "holds, or ran in another environment; the verdict is about the replayed runs"
            )
    return place(verdict, named, lockstep, faithful=not unfaithful)


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
    if not REGISTRY[verdict.cause].compiler_may_explain:
        return verdict, analysis.unrecorded_data
    runs = (records.a, records.b)
    found = compile_bisect(runs, lockstep.replicas, specs, divergence, checkpoints)
    result.compile_bisect = found
    if found is not None:
        verdict = replace(
            verdict,
            evidence=[*verdict.evidence, Evidence(**found.evidence())],
            fix="; ".join(filter(None, (verdict.fix, found.fix))),
        )
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


def _parted_verdict(named: Verdict, parted: list[Parted]) -> Verdict:
    """The replay reproduced neither its records nor the divergence (it parted while
    fast-forwarding): the records' verdict (``named``), with the parting; hidden state where the
    records name no cause."""
    first = min(parted, key=lambda p: p.step)
    detail = (
        f"restored from its checkpoint with every recorded stream and setting, run {first.run} "
        "does not reproduce its own "
        f"recorded {first.what} at step {first.step}"
    )
    evidence = Evidence(
        experiment="replay",
        subject=f"run {first.run}",
        outcome="differs",
        detail=detail,
        run=first.run,
    )
    hidden = named.cause is Cause.UNKNOWN
    return replace(
        named,
        evidence=[*named.evidence, evidence],
        explanation=f"{detail}: the steps read state that no checkpoint holds (a counter in a "
        f"closure, a global, the clock), or a nondeterministic kernel; {named.explanation}",
        cause=Cause.HIDDEN_STATE if hidden else named.cause,
        fix=hidden_state_fix() if hidden else named.fix,
    )


def _init_verdict(
    records: Records, named: Verdict, specs: tuple[LaunchSpec, LaunchSpec], result: CompareResult
) -> Verdict:
    """Runs that differ from their first snapshot: which streams decide the initial state, proven
    by building the code again; where they do not, the config where run B's code built with run
    A's settings gives run A's initial state (proven), else the records' cause (``named``),
    inferred, unless it is a stream's."""
    row = records.timeline[0]
    tensor = row.first_tensor
    found = streams_deciding_init(specs)
    result.replay.performed = True
    cause, confidence, keys = found.cause, found.confidence, _keys(named)
    rng = list(found.streams)
    particulars = _init_particulars(records, found, named, f"{tensor} at step {row.step}")
    if found.cause is Cause.RNG_STATE:
        explanation = (
            f"the runs start from different states ({tensor} differs at step {row.step}): the "
            f"initialisation draws from {', '.join(found.streams)}, which "
            f"{'were reseeded from entropy' if found.reseeds else 'were not seeded alike'}"
        )
        keys = {}
    elif found.settings_decide or named.cause not in (Cause.RNG_STATE, Cause.UNKNOWN):
        # the settings, proven by the rebuild with run A's; else the records' cause, unless a
        # stream's, which the rebuild just put to the test
        if found.settings_decide:
            cause, confidence = Cause.CONFIG, Confidence.PROVEN
            keys = {"config_keys": named.config_keys or list(records.differences.config)}
        else:
            cause, confidence = named.cause, Confidence.INFERRED
        particulars = replace(
            particulars, config_keys=keys.get("config_keys", ()), proven=found.settings_decide
        )
        # the streams the cause left in other states at the first snapshot
        rng = rng or [s for s in row.streams if s in GLOBAL_STREAMS]
        explanation = explanation_for(cause, particulars) + (
            f"; {', '.join(rng)} differ there" if rng else ""
        )
    else:
        explanation = (
            f"{tensor} differs at step {row.step}, and building the code again "
            "with every global stream fixed does not explain it"
        )
        keys = {}
    verdict = Verdict(
        step=row.step,
        phase="init",
        tensor=tensor,
        layer=layer_of(tensor) if tensor else None,
        cause=cause,
        confidence=confidence,
        rng=rng,
        reseeded=list(found.reseeds),
        **keys,
        explanation=explanation,
        fix=fix_for(cause, particulars),
        evidence=list(found.evidence),
    )
    return verdict.with_difference(_init_difference(records, row.step, tensor))


def _keys(named: Verdict) -> dict[str, Any]:
    return {"config_keys": named.config_keys, "environment_keys": named.environment_keys}


def _init_particulars(
    records: Records, found: InitStreams, named: Verdict, where: str
) -> Particulars:
    return Particulars(
        where=where,
        streams=found.streams,
        reseeds=found.reseeds,
        resumed=records.b.meta.options.resumed_from is not None,
        config_keys=named.config_keys,
        config=records.differences.config,
        environment_keys=named.environment_keys,
        differences=records.differences,
    )


def _init_difference(records: Records, step: int, tensor: str | None) -> dict[str, Any]:
    """The size of the first differing tensor's difference at the first snapshot, where both
    runs checkpoint it."""
    a, b = records.a, records.b
    if step in a.checkpoints and step in b.checkpoints and tensor is not None:
        # a name the checkpoints' models may not hold (a wrapper's): then no statistics
        values = [run.checkpoint(step).get("model", {}).get(tensor) for run in (a, b)]
        if all(isinstance(value, torch.Tensor) for value in values):
            return difference_stats(*values)
    return {}
