"""Comparing two runs: where they first differ, and why, established by experiment.

1. The records (:mod:`bisect_repro.diagnose.compare.records`): structure, config, environment, the
   per-step logs and the snapshots, which bound the divergence between the last equal snapshot
   and the first divergent one.
2. The replay (:mod:`bisect_repro.replay.lockstep`): each run relaunched in its own process, the
   way it was recorded (its recipe or its script, its environment variables), restored from its
   last checkpoint at or before the last equal snapshot and stepped in lockstep with the other;
   every replayed step is checked against its own records.
3. The experiments (:mod:`bisect_repro.diagnose.compare.experiments`, and
   :mod:`bisect_repro.diagnose.compare.rebuild` when the runs differ before their first step), each
   a re-run under controlled conditions, which name the cause only when one of them shows it.
4. The rules (:mod:`bisect_repro.diagnose.compare.rules`): every verdict, the replay's or the
   records' (:mod:`bisect_repro.diagnose.compare.from_records`), is checked against its cause's
   precondition on the records before it is reported; a replay that contradicts the records yields
   to them, with a note.

The records' verdict and their signals are made once per pair of runs compared (per rank of
distributed runs) and handed to each stage that needs them: the replay's placement, the checks,
the fallbacks where the replay proves nothing.

Distributed runs are compared rank by rank from their records first: the first divergence over
all ranks (:func:`~bisect_repro.diagnose.compare.records.first_divergence`) names a step and a rank,
and ``ranks`` holds each rank's verdict from the records. Then both runs are replayed on all their
ranks under ``torchrun`` (:mod:`bisect_repro.replay.ranked`), in lockstep, focused on that rank:
the lockstep, the experiments and the verdict are the focus rank's, as for a single process,
with the verdict's ``rank`` set. Where the replay fails or does not reproduce the divergence, the
verdict is the records' and a note says why. Runs of another world size or parallel layout are
compared by the distance of their weights (``numerics``,
:mod:`bisect_repro.diagnose.numerics.numerics`) and from the records of the ranks both have; no
step-by-step replay runs across layouts (the replay runs only the recorded world size).

``compare`` returns a :class:`~bisect_repro.diagnose.compare.verdict.CompareResult`; its
``to_json()`` is the ``bisect-repro/compare/2`` object documented in docs/json.md. ``announce`` is
called with what will be executed before anything is; ``replay=False`` executes nothing. A run that
this user did not record here (its launch claim is not signed with this user's key, see
:mod:`bisect_repro.replay.launch`) is replayed only when ``consent`` agrees; otherwise the verdict
is the records' and a note says how to allow the replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import RunFormatError
from ...replay.forks import forking
from ...replay.launch import Consent, LaunchSpec, ReplayUnavailable, spec_for_run
from ...replay.replica import ReplicaFailed, processes_started
from ...store.nodes import Layout, read_layout
from ...store.run import Run
from ..numerics.envelope import judge
from ..stages import run_stage, timed
from .causes import Cause
from .from_records import rank_verdict, records_verdict, structure_verdict
from .records import Records, first_divergence, rank_zero_alike, read_records, start_at_resume
from .resume import NO_RESUME, align, audit, first_states_differ
from .roles import RECEIVER, roles, through_collectives
from .rules import enforce, reconcile
from .signals import Signals
from .verdict import (
    DIFFERENCE_FIELDS,
    CompareResult,
    Confidence,
    Numerics,
    Outcome,
    RankResult,
    Verdict,
)
from .walk import Progress, walk

__all__ = ["compare"]

_log = logging.getLogger(__name__)

Announce = Callable[[list[LaunchSpec]], None]


def compare(
    path_a: Path | str,
    path_b: Path | str,
    *,
    replay: bool = True,
    accept_changed_code: bool = False,
    consent: Consent | None = None,
    progress: Progress | None = None,
    announce: Announce | None = None,
    numerics: bool = False,
) -> CompareResult:
    """Compare two runs (see the module docstring); ``numerics``: measure run A's rounding
    envelope even where the records explain the divergence (it costs another training)."""
    a, b = Run.open(path_a), Run.open(path_b)
    allow = _Allow(accept_changed_code, consent, numerics)
    if a.distributed or b.distributed:
        return _compare_ranks(
            a, b, replay=replay, allow=allow, progress=progress, announce=announce
        )
    result = _compare_pair(a, b, replay=replay, allow=allow, progress=progress, announce=announce)
    result.ranks = [RankResult(rank=0, verdict=result.verdict, timeline=result.timeline)]
    return result


def _compare_pair(
    a: Run,
    b: Run,
    *,
    replay: bool,
    allow: _Allow,
    progress: Progress | None,
    announce: Announce | None,
) -> CompareResult:
    if a.meta.format != b.meta.format:
        raise RunFormatError(
            b.path / "run.json",
            f"format {b.meta.format} differs from {a.path}'s format {a.meta.format}",
            "re-record both runs with one bisect-repro version",
        )
    with timed("records"):
        a, b, resume = align(a, b)
        records = read_records(a, b)
        if resume is not None and records.structure is None:
            resume = audit(a, b, resume)
            start_at_resume(records, resume)
    if records.structure is not None:
        result = CompareResult(runs=[str(a.path), str(b.path)], differences=records.differences)
        _run_names(records, result)
        result.verdict = structure_verdict(records)
        return result
    result = _result_of(records, a, b)
    result.resume = resume
    if resume is not None:
        result.notes.append(resume.sentence() + (f" ({resume.note})" if resume.note else ""))
    elif not a.distributed and not b.distributed and first_states_differ(a, b):
        result.notes.append(NO_RESUME)
    if records.identical:
        _identical(records, result)
        result.numerics = _numerics(result, records, None, None, allow)
        return result
    named = records_verdict(records)
    specs = _specs(records, result, allow) if replay else None
    replayed = None
    if specs is not None:
        replayed = run_stage(
            "replay",
            result.notes,
            lambda: _replay(records, named, specs, result, progress, announce),
            None,
            "the verdict is from the records alone",
        )
    if replayed is None:
        replayed, notes = enforce(named, Signals.of_records(records))
        result.notes += notes
    result.verdict = replayed
    result.numerics = _numerics(
        result, records, specs[0] if specs is not None else None, _unrepeatable(replayed), allow
    )
    return result


def _numerics(
    result: CompareResult,
    records: Records,
    spec: LaunchSpec | None,
    unrepeatable: str | None,
    allow: _Allow,
) -> Numerics | None:
    """The numerics stage (:func:`~bisect_repro.diagnose.numerics.envelope.judge`)."""
    return run_stage(
        "numerics",
        result.notes,
        lambda: judge(records, spec, unrepeatable, asked=allow.numerics),
        None,
        "the result has no numerics",
    )


def _unrepeatable(verdict: Verdict | None) -> str | None:
    """The op by which the verdict proved that run A differs from itself, if it did: its envelope
    is then run A again, unchanged (any other experiment's change would be read through it)."""
    if (
        verdict is None
        or verdict.cause is not Cause.NONDETERMINISTIC_OP
        or verdict.confidence is not Confidence.PROVEN
    ):
        return None
    shown = any(
        e.experiment == "self_rerun" and e.run == "A" and e.outcome is Outcome.DIFFERS
        for e in verdict.evidence
    )
    return (verdict.op or "a nondeterministic op") if shown else None


def _result_of(records: Records, a: Run, b: Run) -> CompareResult:
    """What the records of two runs (or of one rank of each) say, before any replay."""
    result = CompareResult(runs=[str(a.path), str(b.path)], differences=records.differences)
    _run_names(records, result)
    result.timeline, result.first_log_difference = records.timeline, records.logs
    result.unused_streams = records.unused_streams()
    result.reseeded_steps = records.reseeded_steps()
    result.snapshots = {
        "last_equal": records.last_equal,
        "first_divergent": records.first_divergent,
    }
    return result


def _replay(
    records: Records,
    named: Verdict,
    specs: tuple[LaunchSpec, LaunchSpec],
    result: CompareResult,
    progress: Progress | None,
    announce: Announce | None,
) -> Verdict | None:
    """Both runs replayed under ``specs`` (announced first): the verdict of the experiments, the
    records' (``named``) where they could not prove a cause; ``None``, with a note, when the replay
    failed or did not reproduce the divergence."""
    result.replay.commands = [spec.describe() for spec in specs]
    if announce is not None:
        announce(list(specs))
    started = processes_started()
    with forking() as forks:
        try:
            replayed = walk(records, named, specs, result, progress)
        except (ReplicaFailed, ReplayUnavailable) as error:
            result.notes.append(
                f"the replay failed, so the verdict is from the records alone: {error}"
            )
            return None
        finally:
            result.replay.processes = processes_started() - started + forks.started
            result.replay.forked = forks.forked
            replay = result.replay
            _log.info(
                "replay: %d process(es) started, %d of them forked from %d fork server(s)",
                replay.processes,
                forks.forked,
                forks.started,
            )
    if replayed is None:
        if result.replay.performed:
            result.notes.append(
                "the replay did not reproduce the divergence; the verdict below is from the "
                "records alone"
            )
        return None
    signals = Signals.of_records(records)
    checked, notes = reconcile(_named_by_the_records(replayed, named), signals, named)
    result.notes += notes
    return checked


def _named_by_the_records(verdict: Verdict, named: Verdict) -> Verdict:
    """A replayed verdict that found no cause yields to the cause the records name (``named``: a
    reseed from entropy in the divergent step, a stream that moved differently, a config or
    environment key), marked inferred, with why the replay could not prove it: never "unknown"
    while the records name a cause."""
    if verdict.cause is not Cause.UNKNOWN or named.cause is Cause.UNKNOWN:
        return verdict
    # the replay's location is finer
    if named.step == verdict.step or (verdict.step < named.step and named.phase != "data"):
        named = replace(
            named,
            step=verdict.step,
            phase=verdict.phase,
            layer=verdict.layer,
            tensor=verdict.tensor,
            op=verdict.op,
            **{key: getattr(verdict, key) for key in DIFFERENCE_FIELDS},
        )
    unproven = verdict.explanation or "no experiment isolated a cause"
    return replace(
        named,
        rank=verdict.rank,
        explanation=f"{named.explanation}; the replay could not prove it ({unproven})",
        evidence=[*verdict.evidence, *named.evidence],
    )


def _run_names(records: Records, result: CompareResult) -> None:
    if records.run_names:
        keys = ", ".join(records.run_names)
        result.notes.append(
            f"the config keys {keys} differ only by naming each run's own directory; they cannot "
            "change the numbers"
        )


def _identical(records: Records, result: CompareResult) -> None:
    result.identical = True
    streams = sorted({s for row in records.timeline for s in row.streams})
    if streams:
        result.notes.append(
            f"the runs' tensors match, but some random streams differ: {', '.join(streams)}"
        )


def _layout(run: Run) -> str:
    mesh = (run.distributed.mesh if run.distributed is not None else None) or {}
    shape = f" over a {'x'.join(map(str, mesh['shape']))} mesh" if mesh.get("shape") else ""
    return f"{run.world_size} rank{'s' if run.world_size != 1 else ''} ({run.layout}{shape})"


def _whole(run: Run) -> Layout:
    """The run's nodes and ranks, checked (:func:`read_layout`); a partial run is refused, naming
    what is missing."""
    layout, _ = read_layout(run)
    if layout.missing:
        lost = ", ".join(map(str, layout.missing))
        raise RunFormatError(
            run.path,
            f"partial run: rank {lost} has no records (a node did not run)",
            "compare runs with every rank",
        )
    return layout


def _compare_ranks(
    a: Run,
    b: Run,
    *,
    replay: bool,
    allow: _Allow,
    progress: Progress | None,
    announce: Announce | None,
) -> CompareResult:
    """Distributed runs: rank by rank from the records, then both replayed on all their ranks,
    focused on the first divergent rank."""
    layouts = _layout(a), _layout(b)
    layout = _whole(a), _whole(b)
    specs = None
    ranks = []
    for rank in range(min(a.world_size, b.world_size)):
        records = read_records(a.open_rank(rank), b.open_rank(rank))
        ranks.append((records, rank_verdict(records)))
    first = first_divergence(ranks)
    records, named = first if first is not None else (ranks[0][0], None)
    result = _result_of(records, a, b)
    verdict = named
    if named is not None:
        verdict, notes = enforce(named, Signals.of_records(records))
        result.notes += notes
    result.verdict = verdict
    role = roles(ranks)
    followed = [
        (
            r,
            through_collectives(v, verdict, receiver=role.get(r.a.rank) == RECEIVER)
            if verdict is not None
            else v,
        )
        for r, v in ranks
    ]
    result.ranks = [
        RankResult(
            rank=r.a.rank,
            verdict=v,
            timeline=r.timeline,
            role=role.get(r.a.rank),
            node=layout[0].node_of(r.a.rank),
        )
        for r, v in followed
    ]
    if first is None:
        _identical(records, result)
    elif replay:
        specs = _specs(records, result, allow)
    if layouts[0] != layouts[1]:
        shared = "rank 0" if len(ranks) == 1 else f"ranks 0 to {len(ranks) - 1}"
        result.notes.append(
            f"run A ran on {layouts[0]}, run B on {layouts[1]}: they are compared by the distance "
            "of their weights (numerics); "
            f"the verdict is from the records of {shared}, which both have, and no step-by-step "
            "replay runs across layouts"
        )
    elif specs is not None and named is not None:
        if (layout[0].nnodes or 1) > 1:
            result.notes.append(
                f"run A was recorded on {layout[0].nnodes} nodes of {layout[0].nproc_per_node} "
                "ranks; "
                f"the replay runs its {a.world_size} ranks on this machine alone, where they fit"
            )
        run_stage(
            "replay",
            result.notes,
            lambda: _replay_ranks(records, named, result, specs, progress, announce),
            None,
            "the verdict is from the records alone",
        )
    result.numerics = _numerics(
        result,
        records,
        specs[0].on_ranks(a.world_size, 0) if specs is not None else None,
        _unrepeatable(result.verdict),
        allow,
    )
    if not rank_zero_alike(a, b) and result.numerics is not None:
        _explained_by_layout(result, a, b)
    return result


def _explained_by_layout(result: CompareResult, a: Run, b: Run) -> None:
    """Each verdict of the result (the comparison's and the ranks') that the records explain by
    nothing, said to differ by layout (:func:`_by_layout`)."""
    assert result.numerics is not None
    numerics, made = result.numerics, {}

    def said(verdict: Verdict | None) -> Verdict | None:
        if verdict is None:
            return None
        if id(verdict) not in made:
            made[id(verdict)] = _by_layout(verdict, a, b, numerics)
        return made[id(verdict)]

    result.verdict = said(result.verdict)
    for rank in result.ranks:
        rank.verdict = said(rank.verdict)


def _by_layout(verdict: Verdict, a: Run, b: Run, numerics: Numerics) -> Verdict:
    """A verdict that the records explain by nothing, between runs whose ranks hold other tensors
    (shards against whole tensors, or other names): their hashes differ by layout alone, so it
    says so, and what the distance of their weights says."""
    if verdict.cause is not Cause.UNKNOWN:
        return verdict
    return replace(
        verdict,
        explanation=f"rank {verdict.rank or 0} holds other tensors in each run ({a.layout} on "
        f"{a.world_size}, {b.layout} on {b.world_size}), so its hashes in the two differ at every "
        "snapshot, and nothing else in the records differs; by the distance of their weights, "
        f"{numerics.sentence}",
        fix="none for the layout itself; see numerics, which compares the weights whatever their "
        "layout",
    )


def _replay_ranks(
    records: Records,
    named: Verdict,
    result: CompareResult,
    specs: tuple[LaunchSpec, LaunchSpec],
    progress: Progress | None,
    announce: Announce | None,
) -> None:
    """Both runs replayed on every rank, focused on the rank of the records' verdict (``named``):
    its verdict replaces the records' when the replay reproduces the divergence."""
    focus = records.a.rank
    world = records.a.world_size
    replayed = _replay(
        records,
        named,
        (specs[0].on_ranks(world, focus), specs[1].on_ranks(world, focus)),
        result,
        progress,
        announce,
    )
    if replayed is not None:
        result.verdict = replace(replayed, rank=focus)


@dataclass(frozen=True)
class _Allow:
    """What the user allowed to run: a changed script or recipe, and runs recorded by someone
    else."""

    accept_changed: bool
    consent: Consent | None
    numerics: bool = False
    """Run A's envelope measured even where the records explain the divergence."""


def _specs(
    records: Records, result: CompareResult, allow: _Allow
) -> tuple[LaunchSpec, LaunchSpec] | None:
    """What replays each run, if both may be replayed: checked (:func:`spec_for_run`), and either
    recorded by this user here or allowed by ``consent``; otherwise a note says why not."""
    try:
        specs = (
            spec_for_run(records.a, accept_changed=allow.accept_changed),
            spec_for_run(records.b, accept_changed=allow.accept_changed),
        )
    except ReplayUnavailable as error:
        result.notes.append(f"no replay: {error}")
        return None
    foreign = [(label, spec) for label, spec in zip("AB", specs, strict=True) if not spec.signed]
    if foreign and (allow.consent is None or not allow.consent(foreign)):
        names = " and ".join(f"run {label}" for label, _ in foreign)
        result.notes.append(
            f"no replay: {names} {'was' if len(foreign) == 1 else 'were'} not recorded by you on "
            "this machine as "
            f"{'it is' if len(foreign) == 1 else 'they are'} (no signature of yours, or a file "
            "edited since it was signed: "
            "bisect-repro show names it), "
            "and a replay runs the code a run names; the verdict is from the records alone. To "
            "replay, read what would run "
            f"({'; '.join(f'run {label}: {spec.describe()}' for label, spec in foreign)}) and pass "
            "--trust, or answer yes at the prompt"
        )
        return None
    return specs
