"""The experiments that prove why two runs part ways at a step, each a re-run of that step.

Both replicas stand at the start of the divergent step (see :mod:`bisect_repro.replay.lockstep`).
:class:`StepAnalysis` runs, in this order, and records each experiment as
:class:`~bisect_repro.diagnose.compare.verdict.Evidence`:

1. Full traces of the step in both runs: the first traced tensor that differs gives the phase, the
   layer and the tensor.
2. Each run against itself, re-run from the same state, classified by
   :func:`~bisect_repro.diagnose.selfcheck.check_repeats`: reseeded from entropy (proven by fixing
   the entropy, with the call sites), hidden state (another branch, other ops, other Python values),
   or a nondeterministic op (equal inputs, different outputs, in two pairs of re-runs).
3. When both runs repeat themselves, run B's step is run under run A's conditions until the
   difference vanishes (:mod:`bisect_repro.diagnose.compare.swaps`), first without the reseeds from
   entropy the step logs show there (:mod:`bisect_repro.diagnose.compare.reseeds`).
4. An op trace of both runs names the first op where they part, with the ops around it; the two
   copies of the first divergent tensor give the size of the difference.

A cause is ``proven`` only when one of these showed it; otherwise the verdict says ``unexplained``
(or ``inferred``) and lists what was tried.

The two runs' replicas are separate processes, so what each is asked (the full traces, the re-runs
of each against itself, the op traces) is asked of both at once where the cores allow it
(:meth:`~bisect_repro.replay.lockstep.Lockstep.pair`): the answers are those of asking one after the
other, and where a framework repeats a step in fresh processes, the two runs' processes start side
by side.

Where the guarantees stop: a nondeterministic kernel may agree with itself in every re-run, and then
the step is not seen to differ from itself. In a distributed run every experiment runs on every rank
(the ranks run the step's collectives together) but only the focus rank's outcome is compared; what
an experiment swaps in (run A's streams) is swapped in on the focus rank alone.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ...capture import env
from ...capture.seeding import SeedingCall
from ...capture.trace import TraceEntry, first_difference, first_divergent_op
from ...replay.interface import ReplicaFactory
from ...replay.launch import LaunchSpec
from ...replay.lockstep import Divergence, Lockstep
from ...replay.ranked import start_replica
from ...serve.protocol import StepResult
from ..advice import hidden_state_fix
from ..difference import difference_stats
from ..selfcheck import OPS_PHASE, RERUNS, Repeatability, check_repeats, ops_context
from ..stages import timed
from .causes import Cause
from .causes.entry import Particulars
from .causes.registry import explanation_for, fix_for
from .draft import Draft
from .records import Records
from .reseeds import prove_kept
from .swaps import Swaps
from .verdict import Confidence, Evidence, OpContext, Verdict

__all__ = ["StepAnalysis"]

# what a replay here cannot set
_MACHINE = ("python", "torch", "numpy", "cuda", "cudnn", "devices", "cpu")


def _calls(seeding: list[SeedingCall]) -> str:
    return ", ".join(dict.fromkeys(c.describe() for c in seeding))


class StepAnalysis:
    """The experiments on one divergent step (see the module docstring)."""

    def __init__(
        self,
        records: Records,
        lockstep: Lockstep,
        divergence: Divergence,
        specs: tuple[LaunchSpec, LaunchSpec],
        checkpoints: tuple[int, int],
        *,
        start: ReplicaFactory = start_replica,
    ) -> None:
        self.records, self.divergence, self.start = records, divergence, start
        """What starts a fresh replica of a spec
        (:func:`~bisect_repro.replay.ranked.start_replica`)."""
        self.ra, self.rb = lockstep.replicas
        self.both = lockstep.pair
        """Asks each replica at once, or one after the other
        (:meth:`~bisect_repro.replay.lockstep.Lockstep.pair`)."""
        self.step = divergence.step
        self.checkpoints = checkpoints
        self.evidence: list[Evidence] = []
        self.notes: list[str] = []
        self.ops_context: list[OpContext] = []
        self.reseeded = False
        """A stream ended the step in another state each time it ran from the same state."""
        self.unrecorded_data = False
        """A run's batch differed between re-runs from one state: it draws from no recorded
        stream."""
        self.swaps = Swaps(
            records,
            lockstep.replicas,
            specs,
            checkpoints[1],
            self.step,
            self.evidence,
            start=start,
            checkpoint_a=checkpoints[0],
        )

    def _add(
        self, experiment: str, subject: str, outcome: str, detail: str, run: str | None = None
    ) -> None:
        self.evidence.append(
            Evidence(
                experiment=experiment, subject=subject, outcome=outcome, detail=detail, run=run
            )
        )

    def _rank(self) -> int | None:
        hello = self.ra.hello
        return hello.rank if hello is not None else None

    def explain(self) -> Verdict:
        s = self.step
        with timed("experiment: full traces"):
            ta, tb, index = self._full_traces()
        # a light trace cannot be a base for full re-runs
        full = self.divergence.light[0] is not ta or not self.ra.reruns
        base = (ta, tb) if full else (None, None)
        with timed("experiment: repeats of the step"):
            repeats = self.both(
                partial(check_repeats, self.ra, s, base[0]),
                partial(check_repeats, self.rb, s, base[1]),
            )
        checks = {"A": repeats[0], "B": repeats[1]}
        if index is not None:
            entry = (ta if index < len(ta.entries) else tb).entries[index]
            self._add(
                "replay",
                "runs A and B",
                "differs",
                f"replayed, step {s} first differs at {entry.tensor} ({entry.phase})",
            )
        else:  # the replicas agree here, but one parted from its own records at this step
            parted = next(
                (
                    (label, c)
                    for label, c in checks.items()
                    if not c.repeats and c.trace is not None and c.first is not None
                ),
                None,
            )
            if parted is None:
                return self._agreeing(s)
            index = parted[1].first
            assert index is not None and parted[1].trace is not None
            entry = parted[1].trace.entries[index]
            self._add(
                "replay",
                f"run {parted[0]}",
                "differs",
                f"replayed, run {parted[0]} does not reproduce its own records at step {s}",
                run=parted[0],
            )
        verdict = Draft(
            step=s, phase=entry.phase, layer=entry.layer, tensor=entry.tensor, rank=self._rank()
        )
        for label, check in checks.items():
            self._note_check(label, check)
        self._cause(verdict, checks, (ta, tb), entry)
        if (
            verdict.confidence is not Confidence.PROVEN
            and checks["A"].repeats
            and not checks["B"].repeats
        ):
            with timed("experiment: run B under run A's arguments"):
                if self.swaps.unrepeated_by_arguments(verdict, ta):
                    self.reseeded = False  # run B's command line, not a reseed, makes it differ
        if entry.phase != "data":
            with timed("experiment: locating the op"):
                self._locate(verdict, entry.phase, index, op=verdict.op is None)
        return self._words(verdict)

    def _cause(
        self,
        verdict: Draft,
        checks: dict[str, Repeatability],
        traces: tuple[StepResult, StepResult],
        entry: TraceEntry,
    ) -> None:
        """The experiment that names the cause: a stream reseeded, a run that differs from itself,
        a state kept outside the checkpoint, or the swaps of the data or of what computes."""
        if any(check.streams for check in checks.values()):
            with timed("experiment: reseeded streams"):
                self._reseeded(verdict, {label: c for label, c in checks.items() if c.streams})
        elif any(not check.repeats for check in checks.values()):
            with timed("experiment: a run against itself"):
                self._differs_from_itself(
                    verdict, *next((label, c) for label, c in checks.items() if not c.repeats)
                )
        else:
            with timed("experiment: state kept outside the checkpoint"):
                kept = self._kept(verdict, *traces)
            if kept:
                self.reseeded = True
            elif entry.phase == "data":
                with timed("experiment: swapping the data"):
                    indices = entry.tensor == "batch.indices"
                    self.swaps.data(verdict, indices, self.divergence.fetched[0], traces[0])
            else:
                with timed("experiment: swapping what computes"):
                    self.swaps.compute(verdict, traces[0])

    def _kept(self, verdict: Draft, ta: StepResult, tb: StepResult) -> bool:
        runs = (self.records.a, self.records.b)
        found = prove_kept(
            verdict,
            runs,
            self.swaps.specs,
            self.checkpoints,
            (ta, tb),
            self.start,
            (self.ra, self.rb),
        )
        self.evidence += [found] if found is not None else []
        return found is not None and found.outcome.value == "matches"

    def _agreeing(self, step: int) -> Verdict:
        """Both replicas repeat this step and agree, yet the replay does not reproduce the records
        there. Unless this machine differs from the recording's, replay run A once more with its
        first replayed step run extra times, as many as the steps a run from the start would have
        made before that checkpoint (at least three): when that changes this step, the step depends
        on how often the code ran, which no checkpoint holds (proven); otherwise nothing here
        explains it (a nondeterministic kernel that agreed with itself in the replay is one
        possibility)."""
        self._add(
            "replay",
            "runs A and B",
            "matches",
            f"replayed, the runs agree at step {step} and each repeats it, but not what was "
            "recorded there",
        )
        recorded = self.records.a.meta.environment
        here = env.diff(recorded, self.ra.describe().environment)
        machine = [k for k in here if k in _MACHINE]
        if machine:
            shown = ", ".join(f"{k} {here[k][0]} recorded, {here[k][1]} here" for k in machine)
            self._add(
                "environment",
                "this machine against the recording's",
                "differs",
                f"this machine differs: {shown}",
            )
            return Verdict(
                step=step,
                cause=Cause.ENVIRONMENT,
                confidence=Confidence.INFERRED,
                environment_keys=machine,
                explanation=f"the replay of step {step} does not reproduce the records, and "
                f"this machine differs from the recording's ({shown})",
                fix="compare the runs where they were recorded, or record them again here",
                evidence=list(self.evidence),
            )
        if self.ra.reruns and self._depends_on_calls(step):
            return Verdict(
                step=step,
                cause=Cause.HIDDEN_STATE,
                confidence=Confidence.PROVEN,
                explanation=f"step {step} does not compute what was recorded when replayed from a "
                "checkpoint, and what it computes depends on how many times the code ran before: "
                "it reads state that no checkpoint holds (a counter in a closure, a global)",
                fix=hidden_state_fix(),
                evidence=list(self.evidence),
            )
        return Verdict(
            step=step,
            cause=Cause.UNKNOWN,
            confidence=Confidence.UNEXPLAINED,
            explanation=f"the recorded runs differ at step {step}, but the replayed ones agree and "
            "repeat it: a nondeterministic kernel that agreed with itself here, or state no "
            "checkpoint holds that the experiments did not reach",
            fix=fix_for(Cause.UNKNOWN, Particulars())
            + "; run compare again on an otherwise idle machine, or run doctor on the code",
            evidence=list(self.evidence),
        )

    def _depends_on_calls(self, step: int) -> bool:
        """Replay run A afresh with its first step run extra times: does ``step`` compute something
        else? And, as the control, afresh without them: does it then compute what the replay did?
        (A nondeterministic kernel changes the first and fails the control.)"""
        run, first = self.records.a, self.checkpoints[0]
        extra = max(3, first - run.meta.options.start_step)
        label = f"run A with its first step run {extra} extra times"

        def replayed(times: int) -> StepResult:
            with self.start(self.swaps.specs[0], label) as replica:
                replica.connect()
                replica.restore(run.path, first, run.meta.environment)
                replica.fetch()
                for _ in range(times):
                    replica.run(first, trace="none")
                replica.run(first, trace="none", commit=True)
                replica.skip(step)
                replica.fetch()
                return replica.run(step, trace="light")

        changed = (
            first_difference(self.divergence.light[0].entries, replayed(extra).entries) is not None
        )
        if (
            changed
            and first_difference(self.divergence.light[0].entries, replayed(0).entries) is not None
        ):
            self._add(
                "replay",
                "run A, replayed afresh",
                "differs",
                f"replayed again from step {first}, step {step} computes something else even "
                "without extra runs: it does not repeat",
                run="A",
            )
            return False
        outcome = (
            "computes something else: it depends on how often the code ran"
            if changed
            else "computes the same"
        )
        self._add(
            "replay",
            label,
            "differs" if changed else "matches",
            f"replayed again from step {first} with that step run {extra} extra times first, step "
            f"{step} {outcome}",
            run="A",
        )
        return changed

    # -- 1. where ------------------------------------------------------------------------------
    def _full_traces(self) -> tuple[StepResult, StepResult, int | None]:
        """Full traces of the step in both runs, and the first entry where they differ (``None``:
        they agree)."""
        la, lb = self.divergence.light
        # a framework's lockstep was traced in full
        if not self.ra.reruns and not self.ra.afresh and not self.divergence.parted_only:
            return la, lb, first_difference(la.entries, lb.entries)
        for _ in range(RERUNS if not self.divergence.parted_only else 1):
            ta, tb = self.both(
                partial(self.ra.run, self.step, trace="full"),
                partial(self.rb.run, self.step, trace="full"),
            )
            index = first_difference(ta.entries, tb.entries)
            if index is not None:
                return ta, tb, index
        if self.divergence.parted_only:
            return ta, tb, None
        self.notes.append(
            f"the full trace of step {self.step} did not differ again; the step is located by the "
            "state after it"
        )
        return la, lb, first_difference(la.entries, lb.entries)

    # -- 2. each run against itself ------------------------------------------------------------
    def _note_check(self, label: str, check: Repeatability) -> None:
        if check.streams:
            detail = (
                f"step {self.step} run again from the same state ends with "
                f"{', '.join(check.streams)} in a different state each time"
            )
        elif not check.repeats:
            detail = f"step {self.step} run again from the same state gives a different trace"
        else:
            detail = f"step {self.step} run again from the same state repeats exactly"
        outcome = "matches" if check.repeats else "differs"
        self._add("self_rerun", f"run {label}", outcome, detail, run=label)

    def _reseeded(self, verdict: Draft, checks: dict[str, Repeatability]) -> None:
        for label, check in checks.items():
            what = (
                f"with {_calls(check.reseeds)} given a fixed seed"
                if check.reseeds
                else "with every seeding from entropy given a fixed seed"
            )
            outcome = "repeats exactly" if check.reseed_proven else "still differs from itself"
            self._add(
                "reseed_fixed",
                f"run {label}",
                "matches" if check.reseed_proven else "differs",
                f"{what}, step {self.step} {outcome}",
                run=label,
            )
            verdict.rng = sorted({*verdict.rng, *check.streams})
            verdict.reseeded += [c for c in check.reseeds if c not in verdict.reseeded]
        verdict.cause, self.reseeded = Cause.RNG_STATE, True
        proven = all(c.reseed_proven and c.reseeds for c in checks.values())
        verdict.confidence = Confidence.PROVEN if proven else Confidence.INFERRED

    def _differs_from_itself(self, verdict: Draft, label: str, check: Repeatability) -> None:
        subject = f"run {label}"
        if check.hidden:
            # Only a re-run that took other ops or arguments proves it; re-runs that merely agree
            # with each other and not with the first run could be a kernel that agreed with itself.
            confidence = Confidence.INFERRED if check.first_run_only else Confidence.PROVEN
            verdict.cause, verdict.confidence = Cause.HIDDEN_STATE, confidence
            self._add("self_rerun", subject, "differs", check.hidden, run=label)
            return
        if (
            check.trace is not None
            and check.first is not None
            and check.trace.entries[check.first].phase == "data"
        ):
            # The step's own batch differs between runs from one state: it is drawn from no recorded
            # stream.
            verdict.cause, verdict.confidence, self.unrecorded_data = (
                Cause.DATA_CONTENT,
                Confidence.PROVEN,
                True,
            )
            self._add(
                "self_rerun",
                subject,
                "differs",
                f"step {self.step} run again from the same state (every recorded stream restored) "
                f"draws another {check.trace.entries[check.first].tensor}: the data is drawn from "
                "a generator that no restored stream decides",
                run=label,
            )
            self.swaps.seeded_alike(verdict)  # a global stream drawn before the first snapshot
            return
        if check.op is None:
            verdict.cause, verdict.confidence = Cause.UNKNOWN, Confidence.UNEXPLAINED
            self._add(
                "op_trace",
                subject,
                "inconclusive",
                "no single op with identical inputs gave different outputs in the re-runs",
                run=label,
            )
            return
        op = check.op
        verdict.cause, verdict.op, verdict.layer = (
            Cause.NONDETERMINISTIC_OP,
            op.op,
            op.layer or verdict.layer,
        )
        verdict.confidence = Confidence.PROVEN if check.op_pairs >= 2 else Confidence.INFERRED
        self.ops_context = check.context
        module = f", module {op.layer}" if op.layer else ""
        self._add(
            "op_trace",
            subject,
            "differs",
            f"in {check.op_pairs} pair(s) of re-runs from the same state, {op.op} "
            f"({op.phase or 'step'}{module}) gave other outputs "
            "on identical inputs",
            run=label,
        )
        self._determinism_settings(verdict)

    def _determinism_settings(self, verdict: Draft) -> None:
        """When the runs' determinism switches differ, show whether run A's make run B repeat."""
        keys = [
            k
            for k in self.records.differences.environment
            if "determinis" in k or k.startswith("torch.backends.cudnn.")
        ]
        if not keys:
            return
        settings = {k: self.records.a.meta.environment.get(k) for k in keys}
        runs = [self.rb.run(self.step, trace="full", environment=settings) for _ in range(3)]
        repeats = all(first_difference(runs[0].entries, r.entries) is None for r in runs[1:])
        verdict.environment_keys = keys
        shown = ", ".join(f"{k}={v}" for k, v in settings.items())
        self._add(
            "environment",
            "run B under run A's determinism settings",
            "matches" if repeats else "differs",
            f"with {shown}, step {self.step} of run B "
            f"{'repeats exactly' if repeats else 'still differs from itself'}",
        )

    # -- 4. the op and the size of the difference ----------------------------------------------
    def _locate(self, verdict: Draft, phase: str, index: int, *, op: bool) -> None:
        """One traced run of each: the first op where the runs part (``op``), with the ops around
        it, and the two copies of the first divergent tensor. A nondeterministic step may need a
        few tries to differ again."""
        named = not op
        for _ in range(RERUNS):
            options: dict[str, Any] = {"trace": "full", "keep": [index]}
            if not named:
                options["ops"] = OPS_PHASE.get(phase, "all")
            ra, rb = self.both(
                partial(self.ra.run, self.step, **options),
                partial(self.rb.run, self.step, **options),
            )
            if index in ra.kept and index in rb.kept and verdict.fraction_differing is None:
                stats = difference_stats(ra.kept[index], rb.kept[index])
                if stats.get("fraction_differing"):
                    verdict.set_difference(stats)
            if not named:
                named = self._name_op(verdict, ra.ops or [], rb.ops or [])
            if named and verdict.fraction_differing is not None:
                return

    def _name_op(self, verdict: Draft, oa: list[Any], ob: list[Any]) -> bool:
        found = first_divergent_op(oa, ob)
        if found is None:
            return False
        i, inputs_equal = found
        self.ops_context = ops_context(oa, ob, i)
        if i >= len(oa) or i >= len(ob) or oa[i].op != ob[i].op:
            self.notes.append(f"from op {i} of step {self.step} on, the runs ran different ops")
            return True
        verdict.op = oa[i].op
        if not inputs_equal and oa[i].inputs == ob[i].inputs:
            self.notes.append(
                f"{oa[i].op} received other Python arguments in each run ({oa[i].arguments[:80]} "
                f"vs {ob[i].arguments[:80]})"
            )
        elif not inputs_equal:
            self.notes.append(
                f"{oa[i].op}'s input tensors already differed: the difference entered through "
                "state the trace does not see"
            )
        return True

    # -- the words -----------------------------------------------------------------------------
    def _where(self, verdict: Draft) -> str:
        if verdict.phase == "data":
            if verdict.tensor == "batch.indices":
                return f"step {self.step}, the batch's sample indices"
            return f"step {self.step}, the batch ({verdict.tensor})"
        return f"step {self.step}, {verdict.phase} pass, {verdict.tensor}" + (
            f" (op {verdict.op})" if verdict.op else ""
        )

    def _words(self, verdict: Draft) -> Verdict:
        """The verdict, made from the draft: its explanation and fix worded by its cause."""
        proven = verdict.confidence is Confidence.PROVEN
        data_by = ", ".join(verdict.rng or verdict.config_keys or verdict.environment_keys) or None
        records = self.records
        resumed_here = records.b.meta.options.start_step == self.step > 0
        config = records.differences.config
        particulars = Particulars(
            where=self._where(verdict),
            streams=verdict.rng,
            reseeds=verdict.reseeded,
            reseeded=self.reseeded,
            between=self.step
            if verdict.phase == "data" and verdict.reseeded and self.step > 0
            else None,
            resumed=records.b.meta.options.resumed_from is not None or resumed_here,
            unrestored=records.resume.state_missing if records.resume is not None else (),
            loader=records.a.meta.loader,
            op=verdict.op,
            config_keys=verdict.config_keys,
            config={k: v for k, v in config.items() if k in verdict.config_keys},
            environment_keys=verdict.environment_keys,
            differences=records.differences,
            data_by=data_by if proven else None,  # else not shown by fetching the batch again
            proven=proven,
        )
        explanation = explanation_for(verdict.cause, particulars)
        if verdict.phase == "data" and verdict.rng and not proven:
            explanation += (
                f"; the streams the loader draws from differ there: {', '.join(verdict.rng)}"
            )
        # run B resumed at this very step: what differs is what the resume did not restore
        if resumed_here:
            explanation = (
                f"run B resumed at step {self.step}, and the resume did not "
                f"restore everything: {explanation}"
            )
        return verdict.verdict(
            explanation=explanation,
            fix=fix_for(verdict.cause, particulars),
            evidence=self.evidence,
        )
