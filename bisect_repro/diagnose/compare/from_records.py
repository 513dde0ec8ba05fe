"""The verdict from two runs' records alone, before anything is replayed: always ``inferred``.

:func:`records_verdict` walks :data:`~bisect_repro.diagnose.compare.rules.PRECEDENCE` and names the
cause of the first signal the records show: the sample order, then the batch (with its order equal),
then a reseed from entropy in the step logs, a stream that came apart between the last equal
snapshot and the first divergent one, the config, the environment, a stream that differed all
along and was drawn from, and last, for runs that differ from their first snapshot, the streams
that differ there. A batch that differs with no sample indices recorded places the divergence in
the data of that step, and the cause is the next signal's (never ``data_order``: the order is
not known to differ). The step is the one the logs point to (or the last step before the first
divergent snapshot). A sample order that differs right after a stream the loader draws from was
reseeded from entropy (an epoch's shuffle drawn from a stream reseeded after evaluation) is named
``rng_state`` in the data of that step, "between steps N-1 and N", with the call site.

:func:`structure_verdict` is the verdict for models of another structure, and :func:`rank_verdict`
one rank's verdict (``rank`` set for a distributed run).

Where the guarantees stop: only streams equal at the last equal snapshot and different at the
first divergent one are candidates before those that differed all along (a stream that differed
all along and never moved is named as not the cause); the records place a reseed in a step, not
before or after the step's batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...capture.rng import loader_draws_from
from ...capture.seeding import SeedingCall
from ..causes import Cause, config_values, data_fix, fix_for
from .records import Records, layer_of
from .rules import PRECEDENCE
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
    return Verdict(
        step=0,
        phase="init",
        layer=layer_of(name),
        tensor=name,
        cause=Cause.STRUCTURE,
        confidence=Confidence.PROVEN,
        config_keys=list(records.config_diff),
        explanation=f"the models differ in structure: {detail}",
        fix=fix_for(Cause.STRUCTURE)
        + (
            f" (the settings differ: {', '.join(records.config_diff)})"
            if records.config_diff
            else ""
        ),
        evidence=[
            _from_records(Outcome.DIFFERS, f"the recorded model structures differ: {detail}")
        ],
    )


def _from_records(outcome: Outcome, detail: str, subject: str = "both runs") -> Evidence:
    """What the records alone show (the ``records`` experiment)."""
    return Evidence(experiment="records", subject=subject, outcome=outcome, detail=detail)


@dataclass
class _Window:
    """What the records show between the last equal snapshot and the divergence."""

    end: int
    changed: list[str]
    all_along: list[str]
    reseeds: list[tuple[int, dict[str, Any]]]


@dataclass
class _Finding:
    """A cause the records name, where, and in what words."""

    cause: Cause
    what: str
    step: int | None = None
    phase: str | None = None
    tensor: str | None = None
    rng: list[str] = field(default_factory=list)
    reseeded: list[dict[str, Any]] = field(default_factory=list)
    config_keys: list[str] = field(default_factory=list)
    environment_keys: list[str] = field(default_factory=list)
    fix: str | None = None


def _calls(reseeds: list[tuple[int, dict[str, Any]]]) -> str:
    return "; ".join(dict.fromkeys(SeedingCall.from_json(call).describe() for _, call in reseeds))


def _order(records: Records, w: _Window) -> _Finding | None:
    step = records.logs.get("order")
    if step is None or step > w.end:
        return None
    drawn = [
        (s, c)
        for s, c in records.reseeds(max(step - 1, 0), step)
        if s == step and loader_draws_from(str(c.get("stream", "")))
    ]
    if drawn:  # the step's shuffle drew from a stream reseeded since the last step ended
        streams = sorted({str(c["stream"]) for _, c in drawn})
        what = (
            f"{', '.join(streams)} was reseeded from entropy between steps {step - 1} and {step} "
            f"({_calls(drawn)}), "
            f"and the data of step {step} was drawn from it: the batches hold different samples"
        )
        reseeded = [c for _, c in drawn]
        return _Finding(
            Cause.RNG_STATE, what, step, "data", "batch.indices", rng=streams, reseeded=reseeded
        )
    rng = [s for s in w.changed if loader_draws_from(s)]
    return _Finding(
        Cause.DATA_ORDER,
        "the batches hold different samples",
        step,
        "data",
        "batch.indices",
        rng=rng,
    )


def _unordered_batch(records: Records, w: _Window) -> int | None:
    """The step whose batch differs first, where no sample indices were recorded for it (order or
    content: not told apart)."""
    step = records.logs.get("batch")
    if step is None or step > w.end or records.a.steps.get(step, {}).get("order") is not None:
        return None
    return step


def _batch(records: Records, w: _Window) -> _Finding | None:
    step = records.logs.get("batch")
    if step is None or step > w.end or _unordered_batch(records, w) is not None:
        return None
    return _Finding(
        Cause.DATA_CONTENT,
        "the same samples give different batch contents (the sample order is equal)",
        step,
        "data",
        "batch",
    )


def _reseed(records: Records, w: _Window) -> _Finding | None:
    if not w.reseeds:
        return None
    rng = (
        sorted({call["stream"] for _, call in w.reseeds if isinstance(call.get("stream"), str)})
        or w.changed
    )
    what = f"{', '.join(rng) or 'a stream'} reseeded from entropy, as the step log shows"
    return _Finding(
        Cause.RNG_STATE, what, w.reseeds[0][0], rng=rng, reseeded=[call for _, call in w.reseeds]
    )


def _moved(records: Records, w: _Window) -> _Finding | None:
    if not w.changed or records.last_equal is None:
        return None
    what = (
        f"the random streams {', '.join(w.changed)} changed between the last equal snapshot and "
        "the first divergent one"
    )
    return _Finding(Cause.RNG_STATE, what, rng=w.changed)


def _resumed_at(records: Records) -> tuple[str, int] | None:
    """Which run started from a later step than the other (a resume), and that step."""
    a, b = records.a.meta.options, records.b.meta.options
    if a.start_step == b.start_step and b.resumed_from is None:
        return None
    return ("B", b.start_step) if b.start_step >= a.start_step else ("A", a.start_step)


def _resumed(records: Records, w: _Window) -> _Finding | None:
    resumed = _resumed_at(records)
    streams = list(dict.fromkeys([*w.changed, *w.all_along]))
    data = (
        records.logs.get("order")
        if records.logs.get("order") is not None
        else records.logs.get("batch")
    )
    if resumed is None or not streams or max(w.end, data if data is not None else -1) < resumed[1]:
        return None
    what = (
        f"run {resumed[0]} resumed at step {resumed[1]}, and the resume did not restore every "
        f"random stream ({', '.join(streams)})"
    )
    fix = data_fix("data_order", records.a.meta.loader, resumed=True) if data is not None else None
    return _Finding(Cause.RNG_STATE, what, rng=streams, fix=fix)


def _config(records: Records, w: _Window) -> _Finding | None:
    # a setting no argument names (a config file's)
    if not records.config_diff and records.settings is not None:
        keys = list(records.settings.differing)
        return _Finding(Cause.CONFIG, records.settings.describe(), config_keys=keys)
    if not records.config_diff:
        return None
    named = records.settings.config_keys if records.settings is not None else []
    keys = named or list(records.config_diff)
    shown = ", ".join(config_values(records.config_diff, keys[:4]))
    return _Finding(Cause.CONFIG, f"the settings differ ({shown})", config_keys=keys)


def _environment(records: Records, w: _Window) -> _Finding | None:
    if not records.environment_diff:
        return None
    keys = list(records.environment_diff)
    return _Finding(
        Cause.ENVIRONMENT, f"the environments differ ({', '.join(keys)})", environment_keys=keys
    )


def _all_along(records: Records, w: _Window) -> _Finding | None:
    if not w.all_along:
        return None
    what = f"the random streams {', '.join(w.all_along)} were drawn from while in different states"
    return _Finding(Cause.RNG_STATE, what, rng=w.all_along)


def _at_init(records: Records, w: _Window) -> _Finding | None:
    if records.last_equal is not None or not w.changed:
        return None
    step = records.timeline[0].step
    what = (
        f"the random streams {', '.join(w.changed)} already differ at the first snapshot (step "
        f"{step})"
    )
    return _Finding(Cause.RNG_STATE, what, rng=w.changed)


_FINDERS: dict[str, Callable[[Records, _Window], _Finding | None]] = {
    "order": _order,
    "batch": _batch,
    "reseed": _reseed,
    "moved": _moved,
    "resumed": _resumed,
    "config": _config,
    "environment": _environment,
    "all_along": _all_along,
    "init_streams": _at_init,
}


def records_verdict(records: Records) -> Verdict:
    """The verdict from the records alone (``inferred``); see the module docstring."""
    end = records.end
    changed, all_along = records.changed_streams()
    window = _Window(end, changed, all_along, records.reseeds(records.last_equal or 0, end))
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
    if records.settings is not None:
        evidence.append(
            _from_records(
                Outcome.DIFFERS, records.settings.describe(), subject="the snapshots' settings"
            )
        )
    found = next(
        (f for signal, _, _ in PRECEDENCE if (f := _FINDERS[signal](records, window)) is not None),
        None,
    )
    found = found or _Finding(Cause.UNKNOWN, "nothing in the records explains it")
    unordered = _unordered_batch(records, window)
    # the data of that step differs; the cause is the next signal's
    if unordered is not None and found.step is None:
        found.step, found.phase, found.tensor = unordered, "data", "batch"
        unknown = (
            "the loader's sample indices were not recorded, so order and content are not told apart"
        )
        found.what = f"the batches differ ({unknown}); {found.what}"
    verdict = Verdict(
        step=max(end, 0) if found.step is None else found.step,
        # the first snapshots already differ: the runs part at initialisation
        phase=found.phase or ("init" if end < 0 else None),
        tensor=found.tensor,
        cause=found.cause,
        confidence=Confidence.INFERRED,
        rng=found.rng,
        reseeded=[SeedingCall.from_json(call) for call in found.reseeded],
        config_keys=found.config_keys,
        environment_keys=found.environment_keys,
        evidence=evidence,
    )
    verdict.fix = found.fix or fix_for(
        verdict.cause,
        streams=verdict.rng,
        reseeds=verdict.reseeded,
        resumed=_resumed_at(records) is not None,
        loader=records.a.meta.loader,
        keys=verdict.environment_keys,
        config=records.config_diff,
    )
    verdict.explanation = (
        "from the records alone: the runs first differ at or before step "
        f"{verdict.step}; {found.what}"
    )
    evidence += _streams_not_named(records, window, verdict)
    return verdict


def _streams_not_named(records: Records, w: _Window, verdict: Verdict) -> list[Evidence]:
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
        ", ".join(f"{k} at step {v}" for k, v in records.logs.items() if v is not None)
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
    if records.a.distributed or records.b.distributed:
        verdict.rank = records.a.rank
        verdict.explanation = verdict.explanation.replace(
            "from the records alone", f"from the records of rank {verdict.rank} alone", 1
        )
    return verdict
