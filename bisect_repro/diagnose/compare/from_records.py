"""The verdict from two runs' records alone, before anything is replayed: always ``inferred``.

:func:`records_verdict` walks the registry's precedence
(:data:`~bisect_repro.diagnose.compare.causes.registry.PRECEDENCE`: each cause's records signals,
ordered by their rank, each found by its finder in the cause's own module; docs/causes.md lists
them) and names the cause of the first signal the records show. A batch that differs with no
sample indices recorded places the divergence in the data of that step, and the cause is the next
signal's (never ``data_order``: the order is not known to differ). The step is the one the logs
point to (or the last step before the first divergent snapshot); a finding may place it itself
(the sample order that differs right after a stream the loader draws from was reseeded from
entropy is ``rng_state`` in the data of that step, "between steps N-1 and N", with the call site).

:func:`structure_verdict` is the verdict for models of another structure, and :func:`rank_verdict`
one rank's verdict (``rank`` set for a distributed run). ``compare`` makes the records' verdict
once per pair of runs (per rank) and hands it to every stage that needs it.

Where the guarantees stop: only streams equal at the last equal snapshot and different at the
first divergent one are candidates before those that differed all along (a stream that differed
all along and never moved is named as not the cause); the records place a reseed in a step, not
before or after the step's batch.
"""

from __future__ import annotations

from dataclasses import replace

from ...capture.seeding import SeedingCall
from .causes import Cause
from .causes.entry import Finding, Particulars, Window
from .causes.registry import PRECEDENCE, explanation_for, fix_for
from .records import Records, layer_of
from .verdict import Confidence, Evidence, Outcome, Verdict

__all__ = ["rank_verdict", "records_verdict", "structure_verdict"]


def structure_verdict(records: Records) -> Verdict:
    name = records.structure
    assert name is not None
    shapes = [
        run.meta.model.get("parameters", {}).get(name)
        or run.meta.model.get("buffers", {}).get(name)
        or "absent"
        for run in (records.a, records.b)
    ]
    detail = f"{name} is {shapes[0]} in run A and {shapes[1]} in run B"
    particulars = Particulars(where=detail, differences=records.differences)
    return Verdict(
        step=0,
        phase="init",
        layer=layer_of(name),
        tensor=name,
        cause=Cause.STRUCTURE,
        confidence=Confidence.PROVEN,
        config_keys=list(records.differences.config),
        explanation=explanation_for(Cause.STRUCTURE, particulars),
        fix=fix_for(Cause.STRUCTURE, particulars),
        evidence=[
            _from_records(Outcome.DIFFERS, f"the recorded model structures differ: {detail}")
        ],
    )


def _from_records(outcome: Outcome, detail: str, subject: str = "both runs") -> Evidence:
    """What the records alone show (the ``records`` experiment)."""
    return Evidence(experiment="records", subject=subject, outcome=outcome, detail=detail)


def _found(records: Records, window: Window) -> Finding:
    """The finding of the first signal present, by the precedence; placed in the data of the step
    whose batch differs with no sample indices recorded, where the finding places nothing."""
    found = next(
        (f for signal, _ in PRECEDENCE if (f := signal.find(records, window)) is not None),
        None,
    ) or Finding(cause=Cause.UNKNOWN, what="nothing in the records explains it")
    unordered = records.unordered_batch(window.end)
    if unordered is None or found.step is not None:
        return found
    unknown = (
        "the loader's sample indices were not recorded, so order and content are not told apart"
    )
    return replace(
        found,
        step=unordered,
        phase="data",
        tensor="batch",
        what=f"the batches differ ({unknown}); {found.what}",
    )


def _evidence(records: Records, window: Window) -> list[Evidence]:
    """What the records show before any cause is named: the bounds, a reseed, the settings."""
    evidence = [_from_records(Outcome.DIFFERS, _bounds(records))]
    if window.reseeds:
        step, call = window.reseeds[0]  # a call site and a stream are optional in a step line
        evidence.append(
            _from_records(
                Outcome.DIFFERS,
                f"step {step} reseeded from entropy: {SeedingCall.from_json(call)}",
                subject="the step logs",
            )
        )
    settings = records.differences.settings
    if settings is not None:
        evidence.append(
            _from_records(Outcome.DIFFERS, settings.describe(), subject="the snapshots' settings")
        )
    return evidence


def records_verdict(records: Records) -> Verdict:
    """The verdict from the records alone (``inferred``); see the module docstring."""
    end = records.end
    changed, all_along = records.changed_streams()
    window = Window(end, changed, all_along, records.reseeds(records.last_equal or 0, end))
    found = _found(records, window)
    step = max(end, 0) if found.step is None else found.step
    particulars = Particulars(
        streams=found.rng,
        reseeds=found.reseeded,
        resumed=records.resumed_at() is not None,
        unrestored=records.resume.state_missing if records.resume is not None else (),
        loader=records.a.meta.loader,
        config_keys=found.config_keys,
        config=records.differences.config,
        environment_keys=found.environment_keys,
        differences=records.differences,
        proven=False,
    )
    verdict = Verdict(
        step=step,
        # the first snapshots already differ: the runs part at initialisation
        phase=found.phase or ("init" if end < 0 else None),
        tensor=found.tensor,
        cause=found.cause,
        confidence=Confidence.INFERRED,
        rng=list(found.rng),
        reseeded=list(found.reseeded),
        config_keys=list(found.config_keys),
        environment_keys=list(found.environment_keys),
        explanation=f"from the records{_of_rank(records)} alone: the runs first differ at or "
        f"before step {step}; {found.what}",
        fix=found.fix or fix_for(found.cause, particulars),
    )
    evidence = _evidence(records, window) + _streams_not_named(records, window, verdict)
    return replace(verdict, evidence=evidence)


def _streams_not_named(records: Records, w: Window, verdict: Verdict) -> list[Evidence]:
    """Streams that differ at the divergence but are not the cause, and why."""
    found = []
    still = [
        s
        for s in records.streams_at(records.first_divergent)
        if s not in w.changed and s not in w.all_along
    ]
    if still:
        since = (
            f"between steps {records.last_equal} and {records.first_divergent}"
            if records.last_equal is not None
            else "at all"
        )
        detail = (
            f"{', '.join(still)} differed from the start but did not move {since}: nothing "
            "drew from them, so they are not the cause"
        )
        found.append(_from_records(Outcome.INCONCLUSIVE, detail))
    if w.all_along and verdict.rng != w.all_along:
        streams = ", ".join(w.all_along)
        detail = (
            f"{streams} already differed at step {records.last_equal}, where the runs still "
            "matched, and was drawn from since"
        )
        found.append(_from_records(Outcome.INCONCLUSIVE, detail))
    return found


def _bounds(records: Records) -> str:
    logs = (
        ", ".join(
            f"{k} at step {v}"
            for k, v in records.logs.items()
            if v is not None and k != "first_batch"  # within the batch's bound
        )
        or "no per-step log differs"
    )
    if records.last_equal is None:
        snapshots = (
            f"the snapshots differ from the first one compared (step {records.timeline[0].step})"
            if records.timeline
            else ""
        )
    elif records.first_divergent is None:
        snapshots = (
            f"the snapshots are equal up to the last one compared (step {records.last_equal})"
        )
    else:
        snapshots = (
            f"the snapshots are equal up to step {records.last_equal} and differ at step "
            f"{records.first_divergent}"
        )
    return (
        f"{snapshots}; first log differences: {logs}"
        if snapshots
        else f"first log differences: {logs}"
    )


def rank_verdict(records: Records) -> Verdict | None:
    """One rank's verdict from its records (``None`` when they agree); ``rank`` is set for a
    distributed run."""
    if records.structure is not None:
        verdict = structure_verdict(records)
    elif records.identical:
        return None
    else:
        verdict = records_verdict(records)
    if not records.a.distributed and not records.b.distributed:
        return verdict
    return replace(verdict, rank=records.a.rank)


def _of_rank(records: Records) -> str:
    """`` of rank N`` for a rank of distributed runs, to say whose records speak."""
    return f" of rank {records.a.rank}" if records.a.distributed or records.b.distributed else ""
