"""``doctor``'s experiments on one process of the recipe, each a step run again from the state it
started from.

The recipe runs in a :class:`~bisect_repro.replay.replica.Replica` that has trained its first
steps and kept the state each started from (:func:`bisect_repro.diagnose.doctor.probe.probe`).
:class:`RecipeChecks` then asks, by running:

- does each step repeat from the same state? If not, why
  (:func:`~bisect_repro.diagnose.selfcheck.check_repeats`, the rule ``compare`` uses): a stream
  reseeded from entropy (``reseeded-stream:<name>``), a step that reads state outside the trainee
  (``hidden-state``), or an op that gives different outputs on identical inputs
  (``nondeterministic-op``). Where only the first run differs (the re-runs agree with each
  other), a fresh process of the recipe runs that step for the first time, and again, under the
  op trace: hidden state is named only when the two runs take other ops or hand an op other
  Python arguments; the same ops on the same inputs giving other outputs the first time is an op
  (a ``warning``: runs from the start agree, a resumed run may not); and a first run that does
  not repeat in the fresh process is left to the comparison of processes;
- which ops does PyTorch report under ``torch.use_deterministic_algorithms(True)``?
  (``deterministic-warning``, one finding per op);
- does a step compute something else with one random stream a draw further, or on another
  thread count? Each is compared with a run of the same step just before, which must repeat, so
  a step that counts its own calls cannot pass for one that draws;
- do the dataset's items change with a stream a draw further?

Where guarantees stop: a nondeterministic kernel may agree with itself in every re-run; only the
kept steps are tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...capture.trace import first_difference, first_divergent_op, same_sequence, uninitialised
from ...replay.interface import ReplicaLike
from ...serve.protocol import StepResult
from .. import advice
from ..difference import difference_stats
from ..selfcheck import check_repeats
from .findings import Finding, Severity

__all__ = ["RecipeChecks", "threads_finding"]


def _described(trace: StepResult, index: int) -> str:
    entry = trace.entries[index]
    where = entry.phase if entry.phase in ("data", "optimizer") else f"{entry.phase} pass"
    return f"{entry.tensor} ({where}{f', layer {entry.layer}' if entry.layer else ''})"


def _stats_text(stats: Mapping[str, Any]) -> str:
    if stats.get("max_abs_diff") is None:
        return ""
    return (
        f": max |a-b| = {stats['max_abs_diff']:.3g}, max ULP distance {stats['max_ulp']}, "
        f"{100 * (stats['fraction_differing'] or 0):.2f}% of elements differ"
    )


class RecipeChecks:
    """The experiments of ``doctor`` on one replica (see the module docstring)."""

    def __init__(
        self,
        replica: ReplicaLike,
        outcomes: list[StepResult],
        environment: Mapping[str, Any],
        fresh: Callable[[], ReplicaLike] | None = None,
    ) -> None:
        self.replica, self.outcomes, self.environment, self.fresh = (
            replica,
            outcomes,
            dict(environment),
            fresh,
        )
        self.unrepeatable_step: int | None = None
        self.findings: list[Finding] = []

    # -- does each step repeat? ----------------------------------------------------------------
    def rerun_steps(self) -> None:
        """Re-run each step from the state it started from; on the first that does not repeat, say
        why."""
        for outcome in self.outcomes:
            check = check_repeats(self.replica, outcome.step, outcome, trace="none")
            if not check.repeats:
                if check.first_run_only and self.fresh is not None:
                    confirmed = self._first_run_again(check, outcome)
                    if confirmed is not None:
                        self.findings += confirmed
                        if any(f.severity is Severity.ERROR for f in confirmed):
                            self.unrepeatable_step = outcome.step
                        return
                    # the first run itself differs in another process: the processes' comparison
                    # says why
                    continue
                self.unrepeatable_step = outcome.step
                self.findings += self._why(check)
                return

    def _first_run_again(self, check: Any, first: StepResult) -> list[Finding] | None:
        """Step ``check.step`` run for the first time in a fresh process, then again, under the op
        trace (see the module docstring); ``None`` when that first run computes something else."""
        s = check.step
        assert self.fresh is not None
        # the same steps in the same order, then step s again, as here
        with self.fresh() as replica:
            replica.connect()
            runs = []
            for step in range(len(self.outcomes)):
                replica.fetch(keep=[s] if step > s else [])
                traced: dict[str, Any] = {"ops": "all"} if step == s else {}
                runs.append(replica.run(step, trace="none", commit=True, **traced))
            one, two = runs[s], replica.run(s, trace="none", ops="all")
        if one.outcome != first.outcome:
            return None
        if one.outcome == two.outcome:
            return None  # the fresh process does not repeat what was seen here: nothing is proven
        ops_one, ops_two = one.ops or [], two.ops or []
        where = first_divergent_op(ops_one, ops_two)
        shown = (
            f"{check.hidden}; shown in a fresh process, which computes what the first run did "
            "and then, run again after the same steps, "
        )
        if not same_sequence(ops_one, ops_two):
            evidence = shown + "runs other ops: it took another branch"
        elif (
            where is not None
            and not where[1]
            and ops_one[where[0]].inputs == ops_two[where[0]].inputs
        ):
            x, y = ops_one[where[0]], ops_two[where[0]]
            evidence = (
                shown
                + f"hands {x.op} other Python arguments ({x.arguments[:60]} vs {y.arguments[:60]})"
            )
        elif where is not None and where[1] and not uninitialised(ops_one[where[0]].op):
            op = ops_one[where[0]]
            evidence = (
                f"step {s} gives other results the first time it runs in a process than when it "
                "runs again: in a fresh process, "
                f"{op.op} in the {op.phase or 'step'} pass of {op.layer or 'the step function'} "
                "gives different outputs on identical "
                "inputs the first time and the second; runs from the start agree with each other, "
                "a run resumed from a "
                "checkpoint may not"
            )
            return [
                Finding(
                    "nondeterministic-op",
                    "warning",
                    evidence,
                    advice.op_fix(op.op),
                    layer=op.layer,
                    op=op.op,
                )
            ]
        elif where is not None and not where[1]:
            evidence = (
                shown
                + f"hands {ops_one[where[0]].op} other tensors, from outside the restored state"
            )
        else:
            evidence = shown + "computes something else, outside the ops of the step"
        return [Finding("hidden-state", "error", evidence, advice.hidden_state_fix())]

    def _why(self, check: Any) -> list[Finding]:
        s = check.step
        if check.kind == "reseeded":
            calls = "; ".join(dict.fromkeys(f"{c.call} at {c.where}" for c in check.reseeds))
            proof = (
                "with that seeding given a fixed seed, the step repeats"
                if check.reseed_proven
                else "fixing it did not make the step repeat"
            )
            fix = advice.stream_fix(check.streams, reseeds=check.reseeds)
            return [
                Finding(
                    f"reseeded-stream:{name}",
                    "error",
                    f"step {s} run twice from the same state ends with {name} in a different "
                    "state: "
                    f"{calls or 'something'} reseeds it from entropy during the step; {proof}",
                    fix,
                )
                for name in check.streams
            ]
        if check.kind == "hidden_state":
            evidence = (
                f"{check.hidden}: the step depends on state outside the Trainee, such as "
                "how many times it has been called"
            )
            return [Finding("hidden-state", "error", evidence, advice.hidden_state_fix())]
        where = ""
        if check.trace is not None and check.first is not None:
            stats = self._difference(s, check.first)
            where = (
                "; the step first differs at "
                f"{_described(check.trace, check.first)}{_stats_text(stats)}"
            )
        fresh = not self.replica.reruns and check.trace is not None and check.first is not None
        # a script's fresh process drew another batch
        if check.op is None and fresh and check.trace.entries[check.first].phase == "data":
            return [_unseeded_data(s, where)]
        if check.op is None:
            evidence = (
                f"step {s} run twice from the same state, batch and random streams gives "
                f"different results{where}"
            )
            return [Finding("nondeterministic-op", "error", evidence, advice.op_fix(None))]
        op = check.op
        evidence = (
            f"step {s} run again from the same state, batch and random streams: {op.op} in the "
            f"{op.phase or 'step'} pass of "
            f"{op.layer or 'the step function'} gives different outputs on identical inputs, in "
            f"{check.op_pairs} pair(s) of re-runs{where}"
        )
        return [
            Finding(
                "nondeterministic-op",
                "error",
                evidence,
                advice.op_fix(op.op),
                layer=op.layer,
                op=op.op,
            )
        ]

    def _difference(self, step: int, index: int) -> dict[str, Any]:
        runs = [self.replica.run(step, trace="full", keep=[index]) for _ in range(4)]
        for other in runs[1:]:
            if index in runs[0].kept and index in other.kept:
                stats = difference_stats(runs[0].kept[index], other.kept[index])
                if stats.get("fraction_differing"):
                    return stats
        return {}

    # -- what PyTorch reports ------------------------------------------------------------------
    def determinism_alerts(self) -> None:
        """Step 0 under ``use_deterministic_algorithms(True)``: the ops PyTorch reports."""
        environment = {
            "torch.are_deterministic_algorithms_enabled": True,
            "torch.is_deterministic_algorithms_warn_only_enabled": False,
        }
        alerts = self.replica.run(0, trace="none", alerts=True, environment=environment).alerts
        by_op: dict[Any, list[dict[str, Any]]] = {}
        for alert in alerts:
            places = by_op.setdefault(alert["op"], [])
            if all((alert["layer"], alert["phase"]) != (p["layer"], p["phase"]) for p in places):
                places.append(alert)
        # one finding per op: on CUDA without CUBLAS_WORKSPACE_CONFIG every matmul alerts
        for op, places in by_op.items():
            shown = [
                f"the {p['phase']} pass of {p['layer']}" if p["layer"] else f"the {p['phase']}"
                for p in places[:4]
            ]
            more = f" and {len(places) - 4} more places" if len(places) > 4 else ""
            evidence = (
                "step 0 under torch.use_deterministic_algorithms(True): PyTorch reports "
                f"{op or 'an op'} in {', '.join(shown)}"
                f"{more}: {places[0]['message']}"
            )
            fix = advice.alert_fix(op, places[0]["message"])
            self.findings.append(
                Finding(
                    "deterministic-warning",
                    "warning",
                    evidence,
                    fix,
                    layer=places[0]["layer"],
                    op=op,
                )
            )

    # -- what a step depends on ----------------------------------------------------------------
    def step_changes(self, step: int = 0, **options: Any) -> str | None:
        """Where ``step`` computes something else under ``options`` (``advance``, ``environment``,
        ``streams``), compared with a run just before that repeats; ``None``: it does not, or the
        step does not repeat by itself."""
        base = self.replica.run(step, trace="none")
        if self.replica.run(step, trace="none", **options).outcome == base.outcome:
            return None
        if self.replica.run(step, trace="none").outcome != base.outcome:
            # the step does not repeat by itself: it cannot show what the option changes
            return None
        traced = self.replica.run(step, trace="full")
        other = self.replica.run(step, trace="full", **options)
        index = first_difference(traced.entries, other.entries)
        if index is None:
            return "the state after the step"
        return _described(traced if index < len(traced.entries) else other, index)

    def with_stream_advanced(self, name: str) -> tuple[int, str] | None:
        """The first kept step that computes something else with ``name`` one draw further, and
        where."""
        for outcome in self.outcomes:
            changed = self.step_changes(outcome.step, advance=[name])
            if changed is not None:
                return outcome.step, changed
        return None

    def dataset_draws_from(self, name: str, batch: int) -> bool | None:
        """Whether the dataset's items of step ``batch`` change with ``name`` one draw further
        (``None``: cannot tell)."""
        return self.replica.items_change(batch, name)


def _unseeded_data(step: int, where: str) -> Finding:
    """A script's step, run again in a fresh process started with the global streams seeded alike,
    takes another batch."""
    evidence = (
        f"step {step} of the script, run again in a fresh process with the global random streams "
        "seeded alike, takes another "
        f"batch{where}: the data draws from a source that no global seed reaches (a generator made "
        "without a seed, "
        "np.random.default_rng(), torch.Generator().seed(), random.Random(), or values from time "
        "or os.urandom)"
    )
    fix = (
        "give every generator the script makes a seed (np.random.default_rng(seed), "
        "torch.Generator().manual_seed(seed))"
    )
    return Finding("unseeded-source", "error", evidence, fix)


def threads_finding(findings: list[Finding], local: RecipeChecks) -> None:
    """Prove or weaken the ``threads-unpinned`` warning by running step 0 on another thread
    count."""
    unpinned = next((f for f in findings if f.id == "threads-unpinned"), None)
    if unpinned is None:
        return
    threads = int(local.environment.get("torch.get_num_threads") or 1)
    other = 1 if threads > 1 else 2
    if local.unrepeatable_step == 0:
        unpinned.evidence += "; not tested here, as step 0 already differs from itself"
        return
    changed = local.step_changes(0, environment={"torch.get_num_threads": other})
    if changed is not None:
        unpinned.evidence += (
            f"; shown here: step 0 on {other} thread(s) instead of {threads} "
            f"computes a different {changed}"
        )
    else:
        unpinned.severity = Severity.INFO
        unpinned.evidence += (
            f"; step 0 on {other} thread(s) instead of {threads} computes the "
            "same results, so this recipe may not care"
        )
