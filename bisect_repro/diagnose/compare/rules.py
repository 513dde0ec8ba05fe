"""Which cause a verdict may name: each cause's precondition on the records, the experiment that
proves it and what is said when that experiment cannot run, with the precedence of causes. One
table.

A verdict names a cause (:class:`~bisect_repro.diagnose.causes.Cause`) only where the records'
exact signals allow it. :class:`Signals` are those signals, read from two runs' records
(:meth:`Signals.of_records`) or from a finished comparison (:meth:`Signals.of_result`): the
first step whose sample order differs, the first whose batch differs, the config values,
command-line arguments and optimizer settings that differ, the environment keys that differ, the
random streams that differ and were drawn from, and the steps whose logs show a reseed from entropy.
What only a replay can show (a run that differs from itself, a stream swap that made the
difference vanish) is read from the verdict's own evidence.

:data:`RULES` holds one :class:`Rule` per cause; :func:`violation` checks a verdict against its
cause's rule and says, in one sentence, what the records show instead. ``compare`` checks every
verdict, from the records or from a replay, before reporting it: a replayed verdict that fails
its rule, or that places the divergence after data the records show differing (the sample order
of its step, the batch of an earlier one) and outside the data, is replaced by the records'
verdict, with a note (:func:`reconcile`).

:data:`PRECEDENCE` is the order in which the records alone name a cause (the first signal
present wins); :mod:`bisect_repro.diagnose.compare.from_records` reads it.

Where the guarantees stop: a precondition is necessary, not sufficient: a cause that satisfies it
may still not be the reason the runs part (that is what the experiments are for). Signals read
from a finished comparison cannot tell whether sample indices were recorded; they are taken to be.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..causes import Cause, cause_title
from .verdict import CompareResult, Confidence, Evidence, Outcome, TimelineRow, Verdict

if TYPE_CHECKING:
    from .records import Records

__all__ = [
    "PRECEDENCE",
    "RULES",
    "Rule",
    "Signals",
    "arguments_not_named_for_data",
    "downgrade_unfaithful",
    "enforce",
    "expected_to_part",
    "reconcile",
    "violation",
]


@dataclass(frozen=True, kw_only=True)
class Signals:
    """What the records show exactly (see the module docstring)."""

    order: int | None = None
    """The first step whose sample indices differ."""
    batch: int | None = None
    """The first step whose batch (its tensors' hashes) differs."""
    order_recorded: bool = True
    """Whether the sample indices were recorded at the step where the batch first differs."""
    config: tuple[str, ...] = ()
    """Config keys, command-line arguments and optimizer settings whose values differ."""
    environment: tuple[str, ...] = ()
    streams: tuple[str, ...] = ()
    """Random streams that differ at a snapshot and were drawn from."""
    reseeded: tuple[int, ...] = ()
    """Steps whose logs show a stream reseeded from entropy."""
    at_start: tuple[int, tuple[str, ...]] | None = None
    """The first snapshot, where the runs already differ, with the streams that differ there (drawn
    from or not: what the build drew before it is not in the records)."""
    structure: str | None = None

    @classmethod
    def of_records(cls, records: Records) -> Signals:
        logs = records.logs
        batch = logs.get("batch")
        recorded = batch is None or records.a.steps.get(batch, {}).get("order") is not None
        settings = ("optimizer settings",) if records.settings is not None else ()
        unused = set(records.unused_streams())
        last = max([*records.a.steps, *records.b.steps], default=0)
        return cls(
            order=logs.get("order"),
            batch=batch,
            order_recorded=recorded,
            config=(*records.config_diff, *settings),
            environment=tuple(records.environment_diff),
            streams=tuple(
                dict.fromkeys(s for row in records.timeline for s in row.streams if s not in unused)
            ),
            reseeded=tuple(sorted({step for step, _ in records.reseeds(0, last)})),
            at_start=_at_start(records.timeline, records.last_equal),
            structure=records.structure,
        )

    @classmethod
    def of_result(cls, result: CompareResult) -> Signals:
        logs, verdict = result.first_log_difference, result.verdict
        settings = any(
            e.subject == "the snapshots' settings" for e in (verdict.evidence if verdict else [])
        )
        reseeded = [
            int(step)
            for e in (verdict.evidence if verdict else [])
            if (step := _reseed_step(e)) is not None
        ]
        # the calls a replay saw, or the step logs show, up to the step
        if verdict is not None and verdict.reseeded:
            reseeded.append(verdict.step)
        unused = set(result.unused_streams)
        return cls(
            order=logs.get("order"),
            batch=logs.get("batch"),
            order_recorded=True,  # a finished comparison does not say; taken as recorded
            config=(*result.config_diff, *(("optimizer settings",) if settings else ())),
            environment=tuple(result.environment_diff),
            streams=tuple(
                dict.fromkeys(s for row in result.timeline for s in row.streams if s not in unused)
            ),
            reseeded=tuple(reseeded),
            at_start=_at_start(result.timeline, result.snapshots.get("last_equal")),
            structure=verdict.tensor
            if verdict is not None and verdict.cause is Cause.STRUCTURE
            else None,
        )


def _reseed_step(evidence: Evidence) -> int | None:
    """The step of a records evidence line ``step N reseeded from entropy: ...``."""
    head = evidence.detail.partition(" reseeded from entropy")[0]
    if evidence.subject != "the step logs" or not head.startswith("step "):
        return None
    number = head.removeprefix("step ")
    return int(number) if number.lstrip("-").isdigit() else None


def _shown(
    verdict: Verdict, experiments: tuple[str, ...], outcome: Outcome, *, one_run: bool = False
) -> bool:
    """Whether an experiment (by name or ``name:detail``) showed ``outcome`` (on one run, not on
    both)."""
    return any(
        e.experiment.partition(":")[0] in experiments
        and e.outcome is outcome
        and (not one_run or e.subject.startswith("run "))
        for e in verdict.evidence
    )


def _before(step: int | None, verdict: Verdict) -> bool:
    return step is not None and step <= verdict.step


def _order(s: Signals, v: Verdict) -> bool:
    return _before(s.order, v)


def _content(s: Signals, v: Verdict) -> bool:
    # one state, another batch: content, whatever the order
    redrawn = _shown(v, ("self_rerun",), Outcome.DIFFERS, one_run=True)
    equal_order = s.order_recorded and (
        s.order is None or (s.batch is not None and s.order > s.batch)
    )
    return _before(s.batch, v) and (equal_order or redrawn)


def _config(s: Signals, v: Verdict) -> bool:
    return bool(s.config) and (
        "optimizer settings" in s.config or all(key in s.config for key in v.config_keys)
    )


def _at_start(
    timeline: list[TimelineRow], last_equal: int | None
) -> tuple[int, tuple[str, ...]] | None:
    """The first snapshot and its differing streams, where the runs differ from their first snapshot
    on."""
    if last_equal is not None or not timeline or timeline[0].equal:
        return None
    return timeline[0].step, tuple(timeline[0].streams)


def _rng(s: Signals, v: Verdict) -> bool:
    proven = _shown(v, ("stream", "data_streams", "reseed_fixed", "rebuild"), Outcome.MATCHES)
    # seeding calls a replayed run made
    seen = bool(v.reseeded) and any(e.experiment != "records" for e in v.evidence)
    # the build drew from them
    at_start = s.at_start is not None and v.step <= s.at_start[0] and bool(s.at_start[1])
    return (
        bool(s.streams) or any(step <= v.step for step in s.reseeded) or proven or seen or at_start
    )


def _environment(s: Signals, v: Verdict) -> bool:
    return bool(s.environment) or _shown(v, ("environment",), Outcome.DIFFERS)


def _itself(s: Signals, v: Verdict) -> bool:
    return _shown(v, ("self_rerun", "op_trace"), Outcome.DIFFERS, one_run=True)


def _unrepeated(s: Signals, v: Verdict) -> bool:
    return _shown(v, ("self_rerun", "replay"), Outcome.DIFFERS, one_run=True)


@dataclass(frozen=True)
class Rule:
    """One cause: what the records must show for it to be named, what proves it, what is said
    without that proof."""

    requires: str
    """The precondition, in words (shown when a verdict fails it)."""
    holds: Callable[[Signals, Verdict], bool]
    proof: str
    """The experiment that proves the cause."""
    unproven: str
    """What the verdict says when that experiment cannot run."""
    parts_from_records: bool = False
    """A faithful replay may still not reproduce its own records at the divergent step under this
    cause (also a reseed from entropy, and data drawn from no recorded stream: see
    :func:`expected_to_part`)."""
    proof_survives_unfaithful_replay: bool = False
    """The proof stands where the replay parted from the records before the divergent step."""


RULES: dict[Cause, Rule] = {
    Cause.STRUCTURE: Rule(
        "a parameter or buffer differs in name, shape or dtype",
        lambda s, v: s.structure is not None,
        "the recorded model structures",
        "(always shown by the records)",
    ),
    Cause.DATA_ORDER: Rule(
        "the sample order (the loader's indices) differs at or before the step",
        _order,
        "run B's batch fetched again under run A's loader and streams, then in a fresh process",
        "inferred from the step logs: the batches hold different samples",
    ),
    Cause.DATA_CONTENT: Rule(
        "the batch differs at or before the step while its sample order is equal (or one run draws "
        "another batch from one state)",
        _content,
        "run B's batch fetched again under run A's streams, or the same step drawing another batch "
        "from one state",
        "inferred from the step logs: the same samples give different tensors",
    ),
    Cause.CONFIG: Rule(
        "a config value, a command-line argument or an optimizer setting differs",
        _config,
        "run B rebuilt (a script: relaunched) with run A's config or arguments, the step then "
        "matching",
        "inferred: the settings differ and nothing else the records show does",
    ),
    Cause.RNG_STATE: Rule(
        "a random stream that was drawn from differs, a stream was reseeded from entropy at or "
        "before the step, "
        "or the runs differ from their first snapshot, where a stream differs too",
        _rng,
        "run B's step with run A's streams (or with the entropy fixed) matching",
        "inferred from the snapshots' streams or the step logs' seeding calls",
    ),
    Cause.ENVIRONMENT: Rule(
        "an environment setting, variable or version differs",
        _environment,
        "run B's step under run A's settings (or in a process with run A's variables) matching",
        "inferred: the environments differ and nothing else the records show does",
    ),
    Cause.NONDETERMINISTIC_OP: Rule(
        "a run differs from itself: the same step from the same state gives other results",
        _itself,
        "pairs of re-runs from one state in which an op gives other outputs on identical inputs",
        "not named without a replay",
        parts_from_records=True,
    ),
    Cause.HIDDEN_STATE: Rule(
        "a run does not repeat its own step, or its records, from a restored state",
        _unrepeated,
        "the step re-run from one state taking another path, or depending on how often the code "
        "ran",
        "not named without a replay",
        proof_survives_unfaithful_replay=True,
    ),
    Cause.UNKNOWN: Rule(
        "(none)", lambda s, v: True, "(none)", "nothing in the records explains it"
    ),
}

PRECEDENCE: tuple[tuple[str, Cause, str], ...] = (
    (
        "order",
        Cause.DATA_ORDER,
        "the sample order differs (a loader stream reseeded just before: rng_state, in the data)",
    ),
    (
        "batch",
        Cause.DATA_CONTENT,
        "the batch differs with its order equal (no indices recorded: the data of that step, the "
        "cause below)",
    ),
    ("reseed", Cause.RNG_STATE, "a step log shows a reseed from entropy"),
    (
        "moved",
        Cause.RNG_STATE,
        "a stream equal at the last equal snapshot differs at the first divergent one",
    ),
    (
        "resumed",
        Cause.RNG_STATE,
        "one run resumed from a checkpoint at or before the divergence, with a stream in another "
        "state",
    ),
    ("config", Cause.CONFIG, "a config value, command-line argument or optimizer setting differs"),
    ("environment", Cause.ENVIRONMENT, "an environment setting differs"),
    ("all_along", Cause.RNG_STATE, "a stream that differed all along was drawn from"),
    (
        "init_streams",
        Cause.RNG_STATE,
        "the runs differ from their first snapshot, where streams differ too",
    ),
)
"""How the records alone name a cause: ``(signal, cause, when)``, the first signal present wins."""


PARALLELISM = re.compile(
    r"(?:^|[-_.])(?:num[-_.]?)?(?:workers?|threads?|jobs|procs|processes|cpus)$|^-?j$",
    re.IGNORECASE,
)
"""An argument whose name says it sets how many workers, threads or processes do the work: a
setting for speed, which the data a script draws is expected not to depend on."""


def arguments_not_named_for_data(keys: Sequence[str], reseeded: bool) -> str | None:
    """Why a script's differing arguments are not put to the test for a batch that differs
    (``None``: they are: run B relaunched with run A's arguments, the step then matching, names
    ``config`` in the data). A reseed from entropy at or before the step is the streams' cause
    (``rng_state``); a batch that changes with a worker count alone is drawn in workers seeded per
    worker, the data's own cause (``data_content``)."""
    if not keys:
        return "no argument differs"
    if reseeded:
        return "a stream was reseeded from entropy at or before the step"
    if all(PARALLELISM.search(key.lstrip("-")) for key in keys):
        return (
            f"only the parallelism differs ({', '.join(keys)}): a batch that changes with the "
            "number of workers is drawn in "
            "workers seeded per worker, so the data is named, not the argument"
        )
    return None


def violation(verdict: Verdict, signals: Signals) -> str | None:
    """What is wrong with naming ``verdict.cause`` on these signals (``None``: its precondition
    holds)."""
    rule = RULES[verdict.cause]
    if rule.holds(signals, verdict):
        return None
    return (
        f"{verdict.cause.value} requires that {rule.requires}, and the records do not show it "
        f"({_shown_signals(signals)})"
    )


def _shown_signals(s: Signals) -> str:
    order = (
        f"sample order differs from step {s.order}" if s.order is not None else "sample order equal"
    )
    batch = f"batch differs from step {s.batch}" if s.batch is not None else "batch equal"
    config = f"settings differ: {', '.join(s.config)}" if s.config else "no setting differs"
    return f"{order}, {batch}, {config}"


def reconcile(
    replayed: Verdict, signals: Signals, records: Callable[[], Verdict]
) -> tuple[Verdict, list[str]]:
    """The verdict to report from a replay's, checked against the records: the replay's where it
    satisfies its cause's rule and agrees with the data the records show; otherwise the records'
    verdict (``records()``), at the replay's finer location where the step is the same, with a
    note."""
    problem = violation(replayed, signals)
    # the initial state comes before the first step's data: no data is drawn before it
    data = None if replayed.phase == "init" else _data_before(signals, replayed)
    if problem is None and (data is None or replayed.phase == "data"):
        return replayed, []
    named = records()
    if problem is None:
        problem = (
            f"the records show the batch of step {data} already differs, which the replay "
            f"placed in the {replayed.phase or 'step'}"
        )
    elif named.step == replayed.step and named.phase != "data":
        named.phase, named.layer, named.tensor, named.op = (
            replayed.phase,
            replayed.layer,
            replayed.tensor,
            replayed.op,
        )
    if violation(named, signals) is not None:
        named = replace(named, cause=Cause.UNKNOWN, confidence=Confidence.UNEXPLAINED)
    named.rank = replayed.rank
    named.evidence = [*replayed.evidence, *named.evidence]
    note = (
        f"the replay named {cause_title(replayed.cause)} ({replayed.confidence.value}), but "
        f"{problem}; "
        f"the verdict is the records' ({named.cause.value}, {named.confidence.value})"
    )
    return named, [note]


def _data_before(signals: Signals, verdict: Verdict) -> int | None:
    """The step whose data the records show differing before the verdict's place in its step: the
    sample order of that step or an earlier one (a step's order is drawn before its first forward
    pass), or the batch of an earlier step (a step's later micro-batches may be drawn after its
    first forward)."""
    if signals.order is not None and signals.order <= verdict.step:
        return signals.order
    if signals.batch is not None and signals.batch < verdict.step:
        return signals.batch
    return None


def downgrade_unfaithful(verdict: Verdict) -> bool:
    """A verdict about a replay that parted from its records before the divergent step: proven
    becomes inferred, except where the rule's proof does not rest on the records; whether the
    rule applies (then a note says the verdict is about the replayed runs)."""
    if RULES[verdict.cause].proof_survives_unfaithful_replay:
        return False
    if verdict.confidence is Confidence.PROVEN:
        verdict.confidence = Confidence.INFERRED
    return True


def enforce(verdict: Verdict, signals: Signals) -> tuple[Verdict, list[str]]:
    """A verdict from the records, checked: where it fails its rule, ``unknown`` with a note."""
    problem = violation(verdict, signals)
    if problem is None:
        return verdict, []
    note = (
        f"the records alone pointed to {cause_title(verdict.cause)}, but {problem}; no cause is "
        "named"
    )
    return replace(verdict, cause=Cause.UNKNOWN, confidence=Confidence.UNEXPLAINED), [note]


def expected_to_part(verdict: Verdict | None, *, unrecorded_data: bool = False) -> bool:
    """Whether a replay may part from its own records at the divergent step under this verdict's
    cause (a reseed from entropy, a nondeterministic op, data drawn from no recorded stream)."""
    if verdict is None:
        return False
    return unrecorded_data or bool(verdict.reseeded) or RULES[verdict.cause].parts_from_records
