"""Run B's divergent step again under run A's conditions, one kind at a time, until the difference
vanishes.

Each swap is an experiment on a step that repeats exactly in both runs (see
:mod:`bisect_repro.diagnose.compare.experiments`): when run B, given one of run A's conditions,
computes what run A computes, that condition is the cause, proven. In order:

- the random streams run B starts the step from (then stream by stream, to name them);
- the in-process settings (thread count, determinism and TF32 switches, matmul precision; then
  key by key);
- the environment variables (``OMP_NUM_THREADS``, ``CUBLAS_WORKSPACE_CONFIG``, ...), in a fresh
  process of run B started with run A's, replayed from the checkpoint;
- the config, in a fresh process of run B's recipe rebuilt with run A's config (then key by key),
  its checkpoint restored with the hyperparameters the config gives; for a script, run B's script
  relaunched with run A's command line.

For a difference in the data, the batch is what is compared: run B's batch fetched again under run
A's loader and global streams, then in the fresh processes. A script's loop cannot fetch a batch
again: where its arguments differ and the rules allow it
(:func:`~bisect_repro.diagnose.compare.rules.arguments_not_named_for_data`), run B's script is
relaunched with run A's arguments and the step's full trace compared. A script whose batch no
recorded stream decides (:meth:`Swaps.seeded_alike`) is relaunched, both runs, with the global
streams that differ at the first snapshot seeded alike before the code runs.

Where the guarantees stop: a swap shows that a condition suffices to remove the difference, not
that nothing else contributes; a script's config is its command line, swapped whole (run B's
script relaunched with run A's arguments: the verdict names every argument that differs);
versions and devices cannot be swapped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from ...capture import env
from ...capture.rng import GLOBAL_STREAMS, loader_draws_from, tree_digest
from ...capture.seeding import SeedingCall
from ...capture.trace import first_difference
from ...record.arguments import shown_command
from ...replay.interface import ReplicaFactory, ReplicaLike
from ...replay.launch import LaunchSpec
from ...replay.lockstep import both
from ...replay.ranked import start_replica
from ...replay.replica import ReplicaFailed
from ...serve.protocol import Fetched, StepResult
from ...store.meta import CodeKind
from ...store.run import Run
from .causes import Cause
from .draft import Draft
from .records import Records
from .rules import arguments_not_named_for_data
from .verdict import Confidence, Evidence

__all__ = ["Swaps"]


def _outcome(matched: bool) -> str:
    return "matches" if matched else "differs"


_ALIKE = 1234  # the seed both runs' streams are given where they are relaunched seeded alike


def _same(trace: StepResult, other: StepResult | None) -> bool:
    return other is not None and first_difference(trace.entries, other.entries) is None


def _differing(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    a, b = a or {}, b or {}
    return [name for name in a if name in b and tree_digest(a[name]) != tree_digest(b[name])]


class Swaps:
    """The swaps for one divergent step (see the module docstring)."""

    def __init__(
        self,
        records: Records,
        replicas: tuple[ReplicaLike, ReplicaLike],
        specs: tuple[LaunchSpec, LaunchSpec],
        checkpoint_b: int,
        step: int,
        evidence: list[Evidence],
        *,
        start: ReplicaFactory = start_replica,
        checkpoint_a: int | None = None,
    ) -> None:
        self.records, self.specs, self.checkpoint_b, self.step, self.evidence = (
            records,
            specs,
            checkpoint_b,
            step,
            evidence,
        )
        self.checkpoint_a = checkpoint_b if checkpoint_a is None else checkpoint_a
        self.ra, self.rb = replicas
        self.start = start
        """What starts a fresh replica of a spec
        (:func:`~bisect_repro.replay.ranked.start_replica`)."""

    def _add(
        self,
        experiment: str,
        subject: str,
        matched: bool,
        detail: str,
        narrowed_to: str | None = None,
    ) -> None:
        self.evidence.append(
            Evidence(
                experiment=experiment,
                subject=subject,
                outcome=_outcome(matched),
                detail=detail,
                narrowed_to=narrowed_to,
            )
        )

    # -- a step that computes differently ------------------------------------------------------
    def compute(self, verdict: Draft, trace_a: StepResult) -> None:
        """Streams, settings, variables, config: the first that makes run B's step equal run A's."""
        s = self.step

        def matches(result: StepResult | None) -> bool:
            return _same(trace_a, result)

        if self._step_with_streams(verdict, trace_a):
            return
        if self._settings(
            verdict, lambda settings: matches(self.rb.run(s, trace="full", environment=settings))
        ):
            return
        if self._fresh(verdict, lambda fetched, result: matches(result), data=False):
            return
        verdict.cause, verdict.confidence = Cause.UNKNOWN, Confidence.UNEXPLAINED

    def _step_with_streams(self, verdict: Draft, trace_a: StepResult) -> bool:
        """Run B's whole step with run A's random streams (those that differ at its start and were
        drawn from): the step then matching proves them the cause."""
        s = self.step
        sa, sb = self._streams_at_start()
        # nothing drew from them in either run: cannot matter
        unused = set(self.records.unused_streams())
        differing = [n for n in _differing(sa, sb) if n not in unused]
        if not differing:
            return False

        def with_streams(names: list[str]) -> bool:
            streams = {**sb, **{n: sa[n] for n in names}}
            return _same(trace_a, self.rb.run(s, trace="full", streams=streams))

        if not self._streams(verdict, "stream", differing, with_streams, "random streams"):
            return False
        verdict.cause = Cause.RNG_STATE
        # How those streams came apart, where the step logs show it: a reseed from entropy in an
        # earlier step.
        start = self.records.streams_equal_until(verdict.rng, s)
        verdict.reseeded = [
            SeedingCall.from_json(call) for _, call in self.records.reseeds(start, s, verdict.rng)
        ]
        return True

    # -- a batch that differs ------------------------------------------------------------------
    def data(self, verdict: Draft, order: bool, fetched_a: Fetched, trace_a: StepResult) -> None:
        """The loader's and the global streams, then variables and config, for run B's batch."""
        s, kind = self.step, "order" if order else "batch"
        verdict.cause = (
            Cause.DATA_ORDER
            if order or (fetched_a.order is None and fetched_a.indices is None)
            else Cause.DATA_CONTENT
        )
        if not self.rb.reruns:
            self._data_in_a_framework(verdict)
            if self._resumed_without_streams(verdict):
                return

            def same(fetched: Fetched, result: StepResult | None) -> bool:
                return _same(trace_a, result)

            if self._step_with_streams(verdict, trace_a):
                return  # the streams the step draws its data from (a resume that missed one)
            if self._fresh_variables(verdict, same, data=False) or (
                self._arguments_decide_data() and self._relaunched(verdict, same, data=False)
            ):
                verdict.rng = []  # the streams carried the difference; the relaunch made it
            else:
                self._reseeded_before_data(verdict)
            return
        a, b = self.ra.streams(s), self.rb.streams(s)
        epoch_a, epoch_b = (a.data or {}).get("epoch_streams"), (b.data or {}).get("epoch_streams")
        differing = sorted(
            {*_differing(a.pre_streams, b.pre_streams), *_differing(epoch_a, epoch_b)}
        )
        if differing:

            def with_streams(names: list[str]) -> bool:
                pre = {
                    **b.pre_streams,
                    **{n: a.pre_streams[n] for n in names if n in a.pre_streams},
                }
                epoch = (
                    {**epoch_b, **{n: (epoch_a or {})[n] for n in names if n in (epoch_a or {})}}
                    if epoch_b is not None
                    else None
                )
                return self.rb.data(s, pre_streams=pre, epoch_streams=epoch).digest(
                    kind
                ) == fetched_a.digest(kind)

            if self._streams(
                verdict, "data_streams", differing, with_streams, "loader and global streams"
            ):
                return
        if not self._fresh(
            verdict, lambda fetched, _: fetched.digest(kind) == fetched_a.digest(kind), data=True
        ):
            verdict.confidence = Confidence.UNEXPLAINED

    def _reseeded_before_data(self, verdict: Draft) -> None:
        """A script's batch that no experiment explains, where the step logs show a stream a loader
        draws from reseeded from entropy at or before the step (between the step's start and its
        data: after an evaluation, say): that stream, inferred from the records."""
        calls = [
            call
            for _, call in self.records.reseeds(0, self.step)
            if isinstance(call.get("stream"), str) and loader_draws_from(call["stream"])
        ]
        if not calls:
            return
        verdict.cause, verdict.confidence = Cause.RNG_STATE, Confidence.INFERRED
        verdict.rng = sorted({call["stream"] for call in calls})
        verdict.reseeded = [SeedingCall.from_json(call) for call in calls]

    def _streams_at_start(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Both runs' random streams at the step's start: from the records where both snapshot it,
        else from the replays."""
        s, (a, b) = self.step, (self.records.a, self.records.b)
        if s in a.snapshots and s in b.snapshots:
            return a.snapshot(s)["streams"], b.snapshot(s)["streams"]
        sa, sb = both(partial(self.ra.streams, s), partial(self.rb.streams, s))
        return sa.streams, sb.streams

    def _data_in_a_framework(self, verdict: Draft) -> None:
        """A script's or framework's loader cannot fetch a batch again: name, from the records,
        the streams the loader may have drawn from that differ at the step's start (inferred)."""
        sa, sb = self._streams_at_start()
        differing = [n for n in _differing(sa, sb) if loader_draws_from(n)]
        detail = "a script's or framework's loader cannot fetch a batch again"
        if differing:
            detail += (
                "; the streams a loader shuffles and seeds its workers from differ at the "
                f"step's start: {', '.join(differing)}"
            )
        self.evidence.append(
            Evidence(
                experiment="data_streams",
                subject="run B's batch under run A's streams",
                outcome="inconclusive",
                detail=detail,
            )
        )
        verdict.rng, verdict.confidence = (
            differing,
            Confidence.INFERRED if differing else Confidence.UNEXPLAINED,
        )

    def _resumed_without_streams(self, verdict: Draft) -> bool:
        """A run resumed at this very step without a stream its data draws from (the resume
        audit's): the cause is that stream, inferred, since a resumed script's streams can be set
        only at its first forward, after the step drew its data."""
        resume = self.records.resume
        if resume is None or resume.step != self.step:
            return False
        missed = [
            p.part.removeprefix("stream ")
            for p in resume.parts
            if not p.restored and p.part.startswith("stream ")
        ]
        if not missed:
            return False
        verdict.cause, verdict.rng, verdict.confidence = (
            Cause.RNG_STATE,
            missed,
            Confidence.INFERRED,
        )
        self.evidence.append(
            Evidence(
                experiment="stream",
                subject="run B's step with run A's streams",
                outcome="inconclusive",
                detail=f"not run: run {resume.run} resumed at step {self.step} without "
                f"{', '.join(missed)} (the resume audit), and a resumed script's streams can be "
                "set only at its first forward, after the step drew its data",
            )
        )
        return True

    def _arguments_decide_data(self) -> bool:
        """Whether a script's differing command line is put to the test for its batch (the rule:
        :func:`~bisect_repro.diagnose.compare.rules.arguments_not_named_for_data`); where not, the
        evidence says why."""
        spec_a, spec_b = self.specs
        if spec_b.kind is CodeKind.RECIPE or spec_a.argv == spec_b.argv:
            return False
        why = arguments_not_named_for_data(
            list(self.records.differences.config),
            bool(self.records.reseeds(0, self.step)),
            order_recorded=self.records.unordered_batch(self.step) is None,
        )
        if why is not None:
            subject = "run B relaunched with run A's arguments"
            self.evidence.append(
                Evidence(
                    experiment="config",
                    subject=subject,
                    outcome="inconclusive",
                    detail=f"not run: {why}",
                )
            )
        return why is None

    def unrepeated_by_arguments(self, verdict: Draft, trace_a: StepResult) -> bool:
        """Run B does not repeat its own step, run A does, and a script's command lines differ: run
        B relaunched with run A's arguments then matching run A proves the arguments the cause (a
        flag that seeds a generator no recorded stream holds, an environment's own)."""
        if not self._arguments_decide_data():
            return False
        if not self._relaunched(verdict, lambda _, result: _same(trace_a, result), data=False):
            return False
        verdict.rng, verdict.reseeded = [], []
        return True

    def seeded_alike(self, verdict: Draft) -> bool:
        """A script whose batch no recorded stream decides (one step, from one restored state, draws
        another): the global streams that differ at the first snapshot decide it where they are
        drawn before the snapshot is taken (an unseeded ``np.random.permutation`` split, noise drawn
        at the step's start). Both runs relaunched, each in a fresh process with those streams
        seeded alike before the code runs and left so at the restore: the step then matching proves
        them the cause. The streams drawn from while recording are tried first, then every one
        that differs."""
        first = self.records.timeline[0].streams if self.records.timeline else []
        names = [name for name in first if name in GLOBAL_STREAMS]
        if self.specs[1].kind is CodeKind.RECIPE or not names:
            return False
        unused = set(self.records.unused_streams())
        drawn = [name for name in names if name not in unused]
        for tried in [drawn, names] if drawn and drawn != names else [names]:
            if self._relaunched_alike(tried):
                verdict.cause, verdict.rng, verdict.confidence = (
                    Cause.RNG_STATE,
                    tried,
                    Confidence.PROVEN,
                )
                return True
        return False

    def _relaunched_alike(self, names: list[str]) -> bool:
        """Both runs relaunched with ``names`` seeded alike: whether the step then matches."""
        spec_a, spec_b = self.specs
        seeds, label = (
            dict.fromkeys(names, _ALIKE),
            f"runs A and B relaunched with {', '.join(names)} seeded alike before the code runs",
        )
        ta, tb = both(
            partial(
                self._variant,
                spec_a.with_seeds(seeds),
                label,
                False,
                self.checkpoint_a,
                run=self.records.a,
            ),
            partial(self._variant, spec_b.with_seeds(seeds), label, False),
        )
        matched = ta[1] is not None and _same(ta[1], tb[1])
        outcome = "matches run A: they decide the data" if matched else "still differs"
        self._add("data_streams", label, matched, f"step {self.step} of run B {outcome}")
        return matched

    # -- the kinds of conditions ---------------------------------------------------------------
    def _narrowed(
        self,
        experiment: str,
        subject: str,
        names: list[str],
        vanishes: Callable[[list[str]], bool],
        what: str,
    ) -> list[str] | None:
        """Run A's ``names`` all at once (described by ``what``), then, when that removes the
        difference and there are several, one by one: the names that suffice (``None``: none do)."""
        matched = vanishes(names)
        self._add(
            experiment,
            subject,
            matched,
            f"{what}: step {self.step} of run B {'matches run A' if matched else 'still differs'}",
        )
        if not matched:
            return None
        culprits = [n for n in names if vanishes([n])] if len(names) > 1 else names
        for name in culprits if len(names) > 1 else ():
            self._add(
                experiment,
                f"run B with run A's {name}",
                True,
                f"{name} alone makes step {self.step} match",
                narrowed_to=name,
            )
        return culprits or names

    def _streams(
        self,
        verdict: Draft,
        experiment: str,
        names: list[str],
        vanishes: Callable[[list[str]], bool],
        what: str,
    ) -> bool:
        culprits = self._narrowed(
            experiment,
            f"run B with run A's {what}",
            names,
            vanishes,
            f"with {', '.join(names)} as in run A",
        )
        if culprits is None:
            return False
        verdict.rng, verdict.confidence = culprits, Confidence.PROVEN
        return True

    def _settings(self, verdict: Draft, vanishes: Callable[[dict[str, Any]], bool]) -> bool:
        keys = [k for k in self.records.differences.environment if k in env.APPLICABLE]
        if not keys:
            return False
        recorded = self.records.a.meta.environment
        shown = ", ".join(f"{k}={recorded.get(k)}" for k in keys)
        culprits = self._narrowed(
            "environment",
            "run B under run A's in-process settings",
            keys,
            lambda names: vanishes({k: recorded.get(k) for k in names}),
            f"with {shown}",
        )
        if culprits is None:
            return False
        verdict.cause, verdict.environment_keys, verdict.confidence = (
            Cause.ENVIRONMENT,
            culprits,
            Confidence.PROVEN,
        )
        return True

    def _fresh_variables(
        self,
        verdict: Draft,
        vanishes: Callable[[Fetched, StepResult | None], bool],
        *,
        data: bool,
    ) -> bool:
        """Run B in a fresh process with run A's environment variables, where they differ."""
        spec_a, spec_b = self.specs
        variables = [k for k in self.records.differences.environment if k.startswith("env.")]
        if not variables or spec_a.variables == spec_b.variables:
            return False
        names = ", ".join(k.removeprefix("env.") for k in variables)
        found = self._narrowed(
            "environment_variables",
            "run B with run A's environment variables",
            [", ".join(variables)],
            lambda _: vanishes(
                *self._variant(
                    spec_b.with_variables(spec_a.variables),
                    "run B with run A's environment variables",
                    data,
                )
            ),
            f"a fresh process of run B with {names} as in run A",
        )
        if found is None:
            return False
        verdict.cause, verdict.environment_keys, verdict.confidence = (
            Cause.ENVIRONMENT,
            variables,
            Confidence.PROVEN,
        )
        return True

    def _fresh(
        self,
        verdict: Draft,
        vanishes: Callable[[Fetched, StepResult | None], bool],
        *,
        data: bool,
    ) -> bool:
        """Run B in a fresh process with run A's environment variables, then rebuilt with run A's
        config."""
        if self._fresh_variables(verdict, vanishes, data=data):
            return True
        spec_a, spec_b = self.specs
        config = self.records.differences.config
        if config and spec_b.kind is not CodeKind.RECIPE and spec_a.argv != spec_b.argv:
            return self._relaunched(verdict, vanishes, data=data)
        if not config or spec_b.kind is not CodeKind.RECIPE:
            return False

        first = min(self.records.b.checkpoints, default=self.checkpoint_b)

        def rebuilt(keys: list[str]) -> bool:
            changed = {**spec_b.config, **{k: config[k][0] for k in keys}}
            changed = {k: v for k, v in changed.items() if v is not None or k in spec_a.config}
            spec, label = (
                spec_b.with_config(changed),
                f"run B rebuilt with run A's {', '.join(keys)}",
            )
            if vanishes(*self._variant(spec, label, data)):
                return True
            # a config may have moved state the later checkpoint holds (a scheduler's learning
            # rate): from the start
            return first < self.checkpoint_b and vanishes(
                *self._variant(spec, f"{label}, from step {first}", data, first)
            )

        shown = ", ".join(
            f"{k}={v[0]!r}" if k in spec_a.config else f"{k} as the recipe's default"
            for k, v in config.items()
        )
        keys = self._narrowed(
            "config",
            "run B rebuilt with run A's config",
            list(config),
            rebuilt,
            f"run B rebuilt with {shown}",
        )
        if keys is None:
            return False
        verdict.cause, verdict.config_keys, verdict.confidence = (
            Cause.CONFIG,
            keys,
            Confidence.PROVEN,
        )
        return True

    def _relaunched(
        self,
        verdict: Draft,
        vanishes: Callable[[Fetched, StepResult | None], bool],
        *,
        data: bool,
    ) -> bool:
        """A script's config is its command line: run B's script relaunched with run A's
        arguments."""
        spec_a, spec_b = self.specs
        label = "run B relaunched with run A's arguments"
        command = f"({shown_command(spec_a.argv)})" if spec_a.argv[1:] else "(no arguments)"
        try:
            matched = vanishes(*self._variant(replace(spec_b, argv=list(spec_a.argv)), label, data))
        except ReplicaFailed as error:  # run B's script does not take run A's arguments
            detail = (
                f"run B's script run with run A's command line {command} did not reach step "
                f"{self.step}: {error}"
            )
            self.evidence.append(
                Evidence(experiment="config", subject=label, outcome="inconclusive", detail=detail)
            )
            return False
        outcome = "matches run A" if matched else "still differs"
        self._add(
            "config",
            label,
            matched,
            f"run B's script run with run A's command line {command}: step {self.step} {outcome}",
        )
        if matched:
            verdict.cause, verdict.config_keys, verdict.confidence = (
                Cause.CONFIG,
                list(self.records.differences.config),
                Confidence.PROVEN,
            )
        return matched

    def _variant(
        self,
        spec: LaunchSpec,
        label: str,
        data: bool,
        checkpoint: int | None = None,
        *,
        run: Run | None = None,
    ) -> tuple[Fetched, StepResult | None]:
        """Run B's checkpoint (the replay's, or ``checkpoint``; ``run``'s where given) restored in a
        fresh process of ``spec`` (with the hyperparameters its config gives), replayed to the step:
        its fetch there and, unless ``data``, the step's trace."""
        run = self.records.b if run is None else run
        own = self.specs[0] if run is self.records.a else self.specs[1]
        with self.start(spec, label) as replica:
            replica.connect()
            start = self.checkpoint_b if checkpoint is None else checkpoint
            rebuilt = spec.config != own.config or spec.argv != own.argv
            replica.restore(
                run.path,
                start,
                run.meta.environment,
                rebuilt=rebuilt,
                seeded=tuple(spec.seeds or ()),
            )
            replica.skip(self.step)
            fetched = replica.fetch()
            return fetched, None if data else replica.run(self.step, trace="full")
