"""Does a step repeat when run again from the same state? And if not, why: the rule both
``compare`` and ``doctor`` use.

:func:`check_repeats` re-runs a kept step of a replica from the state it started from (tensors,
streams, the trainee's own state, the batch) and compares each re-run with the first, like with
like (the same tracing). A step that does not repeat is classified, each by an experiment:

- **reseeded**: a random stream ends the step in a different state each time: the step reseeds it
  from entropy. With entropy seeding given a fixed seed the step must repeat, which proves it;
  the seeding calls are named with their call sites.
- **hidden state**: a re-run traced other tensors, ran other ops, or handed an op other Python
  arguments: the step reads state outside what is restored (a counter in a closure, a global,
  the clock). Re-runs that agree with each other but not with the first run are first run in
  pairs under the op trace (a nondeterministic kernel may agree with itself a few times); only if
  no op differs there is it noted as ``first_run_only``, a suspicion that the caller confirms.
- **nondeterministic op**: an op trace of pairs of re-runs finds an op whose inputs, tensors and
  other arguments alike, are equal and whose outputs differ, in at least two pairs. Ops that
  return uninitialised memory are never compared.
- otherwise **unexplained**.

The ops around a nondeterministic op are kept as :class:`OpContext` rows (:func:`ops_context`),
which ``compare --json`` reports as its ``ops_context``.

Where the guarantees stop: a nondeterministic kernel may agree with itself in every re-run (then
the step repeats here); re-running a step whose code counts its own calls advances that count,
which is how it is caught.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..capture.seeding import SeedingCall
from ..capture.trace import (
    OpRecord,
    first_difference,
    first_divergent_op,
    same_sequence,
    uninitialised,
)
from ..replay.interface import ReplicaLike
from ..serve.protocol import StepResult
from ..serve.requests import Trace
from .jsonform import ReadBack, plain_fields

__all__ = ["OpContext", "Repeatability", "check_repeats", "ops_context", "seeds_one_of"]

RERUNS = 4  # a nondeterministic kernel may agree with itself by chance: try a few times
_AGAIN = 2  # re-runs compared with the first
_FIXED_ENTROPY = 20240229
OPS_PHASE = {"forward": "forward", "backward": "backward"}


@dataclass(frozen=True, kw_only=True)
class OpContext(ReadBack):
    """One op around the first divergent op, in run A's order, marked by whether its inputs and
    outputs matched run B's op at the same place."""

    index: int
    op: str
    layer: str | None
    phase: str
    """``forward``, ``backward``, or ``step`` (outside the model)."""
    first: bool
    """The first divergent op."""
    inputs_equal: bool
    outputs_equal: bool

    def to_json(self) -> dict[str, Any]:
        return plain_fields(
            self, "index", "op", "layer", "phase", "first", "inputs_equal", "outputs_equal"
        )


@dataclass
class Repeatability:
    """What re-running a step from the same state showed (see the module docstring)."""

    step: int
    repeats: bool = True
    streams: list[str] = field(default_factory=list)
    """Streams reseeded from entropy during the step."""
    reseeds: list[SeedingCall] = field(default_factory=list)
    """The seeding calls from entropy, with their call sites."""
    reseed_proven: bool = False
    """With entropy seeding fixed, the step repeated."""
    hidden: str | None = None
    """How a re-run took another path (hidden state), in a sentence."""
    first_run_only: bool = False
    """Only the first run differed: the re-runs agreed with each other (``hidden`` says so)."""
    op: OpRecord | None = None
    """The op that gave different outputs on identical inputs."""
    op_pairs: int = 0
    """In how many pairs of re-runs it did."""
    context: list[OpContext] = field(default_factory=list)
    """The ops around it (see :func:`ops_context`)."""
    first: int | None = None
    """The first traced entry that differed between two runs of the step (when traced)."""
    trace: StepResult | None = None

    @property
    def kind(self) -> str:
        if self.repeats:
            return "repeats"
        if self.streams:
            return "reseeded"
        if self.hidden:
            return "hidden_state"
        return "nondeterministic_op" if self.op is not None else "unexplained"


def _same(a: StepResult, b: StepResult, traced: bool) -> bool:
    return first_difference(a.entries, b.entries) is None if traced else a.outcome == b.outcome


def check_repeats(
    replica: ReplicaLike, step: int, base: StepResult | None = None, *, trace: Trace = "full"
) -> Repeatability:
    """Re-run ``step`` (kept in ``replica``) against ``base`` (its first run, or a run now) and
    classify.

    The re-runs are compared with each other as well as with ``base``: a stream that ends in
    another state in each re-run is reseeded from entropy; re-runs that agree with each other and
    not with the first run mean the step behaves differently once it has run (state outside the
    trainee, such as a count of its calls).
    """
    traced = trace != "none"
    # each run in its own process: no run follows another, one re-run suffices
    fresh = not replica.reruns
    base = base or replica.run(step, trace=trace)
    again = [replica.run(step, trace=trace) for _ in range(1 if fresh else _AGAIN)]
    found = Repeatability(step, trace=base)
    compared = (base, again[0]) if fresh else again
    found.streams = sorted(
        {
            n
            for r in compared[1:]
            for n, d in r.streams_after.items()
            if compared[0].streams_after.get(n) != d
        }
    )
    found.repeats = not found.streams and all(
        _same(base, r, traced) and base.streams_after == r.streams_after for r in again
    )
    if found.repeats:
        return found
    if traced:
        found.first = next(
            (i for r in again if (i := first_difference(base.entries, r.entries)) is not None), None
        )
    if found.streams:
        seen = [
            c
            for r in (base, *again)
            for c in r.seeding
            if c.get("entropy") and seeds_one_of(c, found.streams)
        ]
        fixed = [replica.run(step, trace=trace, fixed_entropy=_FIXED_ENTROPY) for _ in range(2)]
        found.reseed_proven = (
            _same(fixed[0], fixed[1], traced) and fixed[0].streams_after == fixed[1].streams_after
        )
        seen += [
            c
            for r in fixed
            for c in r.seeding
            if c.get("entropy") and seeds_one_of(c, found.streams)
        ]
        found.reseeds = list(
            {(c["call"], c.get("where")): SeedingCall.from_json(c) for c in seen}.values()
        )
        return found
    third = again[0] if fresh else replica.run(step, trace=trace)
    if not fresh and all(
        _same(again[0], r, traced) and again[0].streams_after == r.streams_after
        for r in (again[1], third)
    ):
        # a kernel that agreed with itself in the re-runs but not always?
        _locate_op(replica, step, "all", found)
        if found.op is None and found.hidden is None:
            found.hidden = (
                f"step {step} run again from the same state computes the same each time, but not "
                "what its first run computed: "
                "it behaves differently once it has run"
            )
            found.first_run_only = True
        return found
    if not traced:  # an untraced difference: trace to see where
        base = replica.run(step, trace="full")
        again = [replica.run(step, trace="full") for _ in range(1 if fresh else _AGAIN)]
        found.trace = base
    differing = [r for r in again if first_difference(base.entries, r.entries) is not None]
    if any([e.tensor for e in r.entries] != [e.tensor for e in base.entries] for r in again):
        found.hidden = (
            f"re-run from the same state, step {step} traced other tensors: it took another branch"
        )
        return found
    found.first = first_difference(base.entries, differing[0].entries) if differing else None
    phase = base.entries[found.first].phase if found.first is not None else "all"
    _locate_op(replica, step, OPS_PHASE.get(phase, "all"), found)
    return found


def _locate_op(replica: ReplicaLike, step: int, phase: str, found: Repeatability) -> None:
    hits: Counter[tuple[str, str | None, str]] = Counter()
    records: dict[tuple[str, str | None, str], OpRecord] = {}
    for _ in range(RERUNS + 1):
        one, two = (replica.run(step, trace="none", ops=phase).ops or [] for _ in range(2))
        if not same_sequence(one, two):
            found.hidden = (
                f"re-run from the same state, step {step} ran other ops: it took another branch"
            )
            return
        where = first_divergent_op(one, two)
        if where is None:
            continue
        i, inputs_equal = where
        if not inputs_equal and one[i].inputs == two[i].inputs:
            found.hidden = (
                f"re-run from the same state, {one[i].op} received other Python arguments in step "
                f"{step} "
                f"({one[i].arguments[:60]} vs {two[i].arguments[:60]}): a value from outside the "
                "restored state"
            )
            return
        if inputs_equal and not uninitialised(one[i].op):
            key = (one[i].op, one[i].layer, one[i].phase)
            hits[key] += 1
            records[key] = one[i]
            found.context = ops_context(one, two, i)
            if hits[key] >= 2:
                break
    if hits:
        key, found.op_pairs = hits.most_common(1)[0]
        found.op = records[key]


def ops_context(
    a: list[OpRecord], b: list[OpRecord], index: int, around: int = 4
) -> list[OpContext]:
    """The ops around ``index`` in ``a``'s order, each marked by whether its inputs and outputs
    matched ``b``'s."""
    rows = []
    for i in range(max(0, index - around), min(len(a), index + around + 1)):
        other = b[i] if i < len(b) else None
        rows.append(
            OpContext(
                index=i,
                op=a[i].op,
                layer=a[i].layer,
                phase=a[i].phase or "step",
                first=i == index,
                inputs_equal=other is not None and a[i].same_inputs(other),
                outputs_equal=other is not None
                and a[i].op == other.op
                and a[i].outputs == other.outputs,
            )
        )
    return rows


def seeds_one_of(call: dict[str, Any], streams: list[str]) -> bool:
    """Whether a seeding call seeds one of ``streams`` (``cuda`` seeds every ``cuda:N``)."""
    name = call.get("stream", "")
    return name in streams or (name == "cuda" and any(s.startswith("cuda:") for s in streams))
