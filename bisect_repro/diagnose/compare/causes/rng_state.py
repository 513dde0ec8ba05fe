"""``rng_state``: a random stream was in different states, or was reseeded from entropy.

The records name it from four signals, in their places in the precedence: a step log's reseed from
entropy; a stream equal at the last equal snapshot and different at the first divergent one; a
run resumed at or before the divergence with a stream in another state; a stream that differed
all along and was drawn from; and, for runs that differ from their first snapshot, the streams
that differ there (the build drew from them). A replay proves it by running run B's step with run
A's streams (or with the entropy seeding fixed) and seeing it match.
"""

from __future__ import annotations

from ....capture.seeding import SeedingCall
from ...advice import data_fix, stream_fix
from ..records import Records
from ..signals import Signals, shown_by
from ..verdict import Outcome, Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window

__all__ = ["ENTRY"]


def _reseed(records: Records, w: Window) -> Finding | None:
    if not w.reseeds:
        return None
    rng = (
        sorted({call["stream"] for _, call in w.reseeds if isinstance(call.get("stream"), str)})
        or w.changed
    )
    return Finding(
        cause=Cause.RNG_STATE,
        what=f"{', '.join(rng) or 'a stream'} reseeded from entropy, as the step log shows",
        step=w.reseeds[0][0],
        rng=rng,
        reseeded=[SeedingCall.from_json(call) for _, call in w.reseeds],
    )


def _moved(records: Records, w: Window) -> Finding | None:
    if not w.changed or records.last_equal is None or _moved_after_a_setting(records):
        return None
    what = (
        f"the random streams {', '.join(w.changed)} changed between the last equal snapshot and "
        "the first divergent one"
    )
    return Finding(cause=Cause.RNG_STATE, what=what, rng=w.changed)


def _moved_after_a_setting(records: Records) -> bool:
    """A setting differs and the step logs show the window's first step already computing on
    another batch or loss: the runs part there, and a stream that moved somewhere in the window
    cannot be placed before it (a batch of another length draws another number of dropout masks),
    so the setting, present from the start, is named instead."""
    first = min(
        (step for key in ("batch", "loss") if (step := records.logs.get(key)) is not None),
        default=None,
    )
    return bool(records.differences.config) and first == records.last_equal


def _resumed(records: Records, w: Window) -> Finding | None:
    resumed = records.resumed_at()
    audited = records.resume.missing if records.resume is not None else []
    missed = [part.removeprefix("stream ") for part in audited if part.startswith("stream ")]
    streams = list(dict.fromkeys([*w.changed, *w.all_along, *missed]))
    order = records.logs.get("order")
    data = order if order is not None else records.logs.get("batch")
    if resumed is None or not streams or max(w.end, data if data is not None else -1) < resumed[1]:
        return None
    what = (
        f"run {resumed[0]} resumed at step {resumed[1]}, and the resume did not restore every "
        f"random stream ({', '.join(streams)})"
    )
    loader = records.a.meta.loader
    fix = data_fix(loader, order=True, resumed=True) if data is not None else None
    return Finding(cause=Cause.RNG_STATE, what=what, rng=streams, fix=fix)


def _all_along(records: Records, w: Window) -> Finding | None:
    if not w.all_along:
        return None
    what = f"the random streams {', '.join(w.all_along)} were drawn from while in different states"
    return Finding(cause=Cause.RNG_STATE, what=what, rng=w.all_along)


def _at_init(records: Records, w: Window) -> Finding | None:
    if records.last_equal is not None or not w.changed:
        return None
    step = records.timeline[0].step
    # those drawn from later were live streams; the others may have been drawn by the build alone
    unused = set(records.unused_streams())
    drawn = [name for name in w.changed if name not in unused] or w.changed
    what = (
        f"the random streams {', '.join(drawn)} already differ at the first snapshot (step {step})"
    )
    if not set(drawn) - unused and len(records.timeline) > 1:
        what += (
            " and none of them was drawn from after it: whether the build drew from them is not "
            "recorded"
        )
    return Finding(cause=Cause.RNG_STATE, what=what, rng=drawn)


def _holds(s: Signals, v: Verdict) -> bool:
    proven = shown_by(v, ("stream", "data_streams", "reseed_fixed", "rebuild"), Outcome.MATCHES)
    # seeding calls a replayed run made
    seen = bool(v.reseeded) and any(e.experiment != "records" for e in v.evidence)
    # the build drew from them
    at_start = s.at_start is not None and v.step <= s.at_start[0] and bool(s.at_start[1])
    reseeded = any(step <= v.step for step in s.reseeded)
    return bool(s.streams) or reseeded or proven or seen or at_start


def _explain(p: Particulars) -> str:
    named = ", ".join(p.streams)
    matches = ", and with run A's streams run B matches" if p.proven else ""
    if p.reseeds:
        calls = "; ".join(dict.fromkeys(r.describe() for r in p.reseeds))
        if p.between is not None:
            return (
                f"{named} was reseeded from entropy between steps {p.between - 1} and {p.between} "
                f"({calls}), and the data of step {p.between} was drawn from it: {p.where} differs"
            )
        if not p.reseeded:
            return (
                f"{named} was reseeded from entropy before this step ({calls}), so the runs draw "
                f"from it in different states: {p.where} differs{matches}"
            )
        return (
            f"{named} is reseeded from entropy during the step ({calls}), so {p.where} differs "
            "from run to run"
        )
    # no call from entropy was seen: a seed that changes (the clock's), or a call not watched
    if p.reseeded:
        return (
            f"{named} ends the step in a different state each time the step runs from the same "
            f"state: it is reseeded during the step from a value that changes, so {p.where} "
            "differs from run to run"
        )
    return (
        f"the runs draw from random streams in different states ({named}): {p.where} "
        f"differs{matches}"
    )


ENTRY = CauseEntry(
    cause=Cause.RNG_STATE,
    title="a random stream not seeded alike",
    meaning="a random stream (Python, NumPy, torch, CUDA, a loader's or the recipe's generator) "
    "was in different states, or was reseeded from entropy",
    requires="a random stream that was drawn from differs, a stream was reseeded from entropy at "
    "or before the step, or the runs differ from their first snapshot, where a stream differs too",
    holds=_holds,
    proof="run B's step with run A's streams (or with the entropy seeding fixed) matching",
    unproven="inferred from the snapshots' streams or the step logs' seeding calls",
    remedy="`random.seed`, `np.random.seed`, `torch.manual_seed`, `torch.cuda.manual_seed_all`, "
    "a seeded `generator=`; the reseeding call to remove, with its file and line; on resume, "
    "restore every stream",
    fix=lambda p: stream_fix(p.streams, resumed=p.resumed, reseeds=p.reseeds),
    explain=_explain,
    signals=(
        RecordsSignal(
            name="reseed", rank=30, when="a step log shows a reseed from entropy", find=_reseed
        ),
        RecordsSignal(
            name="moved",
            rank=40,
            when="a stream equal at the last equal snapshot differs at the first divergent one "
            "(not where a setting differs and the batch already differs at the first step after "
            "the equal snapshot)",
            find=_moved,
        ),
        RecordsSignal(
            name="resumed",
            rank=50,
            when="one run resumed from a checkpoint at or before the divergence, with a stream in "
            "another state",
            find=_resumed,
        ),
        RecordsSignal(
            name="all_along",
            rank=80,
            when="a stream that differed all along was drawn from",
            find=_all_along,
        ),
        RecordsSignal(
            name="init_streams",
            rank=90,
            when="the runs differ from their first snapshot, where streams differ too (those "
            "drawn from afterwards, where any is)",
            find=_at_init,
        ),
    ),
)
