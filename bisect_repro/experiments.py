"""Experiments on a recipe built in this process: each step re-run from the same state.

:class:`InProcess` builds the recipe as a :class:`~bisect_repro.replay.Replica`, runs the first
``steps`` steps once, keeping the state each starts from (model, optimizer, batch, every random
stream) and a digest of the state and gradients it ends in, and then re-runs steps from those
starts to answer ``doctor``'s questions by running, not by reading the recipe:

- does a step differ from itself? (``rerun_steps``: ``nondeterministic-op``, with the ops that
  give different outputs on identical inputs, their module and pass);
- which ops does PyTorch report under ``torch.use_deterministic_algorithms(True)``?
  (``determinism_alerts``: ``deterministic-warning``, one finding per op);
- does step 0 change with a random stream one draw further, or with other settings?
  (``with_stream_advanced``, ``step_changes``: which unseeded streams matter, and the thread count);
- do the dataset's items change with a stream one draw further? (``dataset_draws_from``).

Why this order of cost: a re-run compares one digest of the state after the step (cheap); only a
step that differs is traced, tensor by tensor and then op by op, and only the pass (forward or
backward) where it first differs, since hashing every op's tensors is what costs.

Where guarantees stop: a nondeterministic kernel may agree with itself by chance in all
``_RERUNS`` re-runs, or differ only in ops whose outputs hold uninitialised memory (``empty``,
``resize``), which are not counted; a step that already differs from itself cannot show what
another stream or thread count changes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from . import causes
from .compare import difference_stats
from .data import hidden_streams, loader_generators
from .errors import RecipeError
from .findings import finding
from .hashing import hash_tensors
from .recorder import batch_tensors, combine_digests
from .replay import Replica, StepStart, StepTrace
from .rng import GLOBAL_STREAMS, RandomSource, RandomStreams
from .scope import DeterminismAlerts, ScopedOps
from .trace import OpRecord, first_difference

__all__ = ["InProcess"]

_RERUNS = 5  # reruns of each step; a nondeterministic kernel may agree with itself by chance
_ATTEMPTS = 6  # traced re-runs to catch a difference already seen once
_UNINITIALISED = ("empty", "resize")  # ops whose outputs hold whatever was in memory


def _sources(trainee: Any) -> dict[str, RandomSource]:
    """The recipe's own random streams by name: the loader's, its ``generators``, those in the dataset."""
    return {**loader_generators(trainee.loader), **dict(trainee.generators or {}), **hidden_streams(trainee)}


def _draw(name: str, sources: Mapping[str, RandomSource]) -> None:
    """Advance the stream ``name`` by one draw (global streams: in the current process state)."""
    if name == "python":
        random.random()
    elif name == "numpy":
        np.random.random()
    elif name == "torch":
        torch.rand(())
    elif name.startswith("cuda:"):
        torch.rand((), device=name)
    elif isinstance(source := sources[name], torch.Generator):
        torch.rand((), generator=source, device=source.device)
    elif isinstance(source, np.random.Generator):
        source.random()
    elif isinstance(source, np.random.RandomState):
        source.random_sample()
    else:
        source.random()


def _described(trace: StepTrace, index: int) -> str:
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


class InProcess:
    """The recipe built in this process, stepped and re-run (experiment 2 of ``doctor``'s module docstring).

    Re-runs compare the state after the step (cheap); only a step that differs is traced, tensor
    by tensor and then op by op, to say where.
    """

    def __init__(self, target: str, config: Mapping[str, Any], steps: int) -> None:
        self.replica = Replica.from_recipe(target, config, "doctor")
        if self.replica.trainee.step is None:
            self.replica.close()
            raise RecipeError(f"{target}: the Trainee has no step function; doctor needs step=... to run the recipe")
        self.steps = steps
        self.starts: list[tuple[StepStart, str]] = []
        self.start0: StepStart | None = None
        self.outcome0: str | None = None
        self.nondeterministic_step: int | None = None
        self.findings: list[dict[str, Any]] = []

    def close(self) -> None:
        self.replica.close()

    def _outcome(self, start: StepStart, **options: Any) -> str:
        """A digest of the whole state and the gradients after running the step from ``start``
        (untraced). The gradients keep a difference that the update rounds away (plain SGD)."""
        self.replica.run_step(start, trace=False, **options)
        model = self.replica.trainee.model
        grads = {f"{name}.grad": p.grad for name, p in model.named_parameters() if p.grad is not None}
        return combine_digests(hash_tensors({**self.replica.state.tensors(), **grads}))

    def run_steps(self) -> None:
        """Run the first steps once, keeping the state each starts from and the state it ends in."""
        for _ in range(self.steps):
            start = self.replica.fetch()
            self.starts.append((start, self._outcome(start)))
            self.replica.step = start.step + 1
        self.start0, self.outcome0 = self.starts[0]

    def rerun_steps(self) -> None:
        """Re-run each step from the state it started from; on the first difference, say where.

        Meant to run while nothing else of doctor's runs: a race between threads shows best on
        an otherwise idle machine.
        """
        for _ in range(_RERUNS):
            for start, outcome in self.starts:
                if self._outcome(start) != outcome:
                    self.nondeterministic_step = start.step
                    self.findings += self._locate(start)
                    return

    def _traced_difference(self, start: StepStart, **options: Any) -> tuple[StepTrace, int] | None:
        """Traces of the step as it is and with ``options``, and the first entry that differs."""
        for _ in range(_ATTEMPTS):
            base = self.replica.run_step(start)
            index = first_difference(base.entries, self.replica.run_step(start, **options).entries)
            if index is not None:
                return base, index
        return None

    def _locate(self, start: StepStart) -> list[dict[str, Any]]:
        """Op-level traces of the step, twice, until an op with equal inputs gives different outputs."""
        found = self._traced_difference(start)
        if found is None:
            evidence = f"step {start.step} run twice from the same state, batch and random streams ends in different states"
            return [finding("nondeterministic-op", "error", evidence, causes.op_fix(None))]
        base, index = found
        ops: list[tuple[str, str | None, str]] = []
        stats: dict[str, Any] = {}
        skip = "backward" if base.entries[index].phase == "forward" else "forward"  # the other pass matched
        for _ in range(_ATTEMPTS):
            model = self.replica.trainee.model
            tracers = (ScopedOps(model, skip), ScopedOps(model, skip))
            traces = [self.replica.run_step(start, keep={index}, within=tracer.tracing()) for tracer in tracers]
            if index in traces[0].kept and index in traces[1].kept:
                measured = difference_stats(traces[0].kept[index], traces[1].kept[index])
                stats = measured if measured.get("fraction_differing") else stats
            ops = _divergent_ops(tracers[0].result(), tracers[1].result(), tracers[0].phases)
            if ops:
                break
        first = f"the step first differs at {_described(base, index)}{_stats_text(stats)}"
        entry = base.entries[index]
        if not ops:
            evidence = f"step {start.step} run twice from the same state, batch and random streams gives different results; {first}"
            return [finding("nondeterministic-op", "error", evidence, causes.op_fix(None), layer=entry.layer)]
        found_ops = []
        for op, layer, phase in ops:
            evidence = (
                f"step {start.step} run twice from the same state, batch and random streams: {op} in the {phase} pass of "
                f"{layer or 'the step function'} gives different outputs on identical inputs; {first}"
            )
            found_ops.append(finding("nondeterministic-op", "error", evidence, causes.op_fix(op), layer=layer or entry.layer, op=op))
        return found_ops

    def determinism_alerts(self) -> None:
        """Step 0 under ``use_deterministic_algorithms(True)``: the ops PyTorch reports."""
        assert self.start0 is not None
        environment = {
            **self.replica.environment,
            "torch.are_deterministic_algorithms_enabled": True,
            "torch.is_deterministic_algorithms_warn_only_enabled": False,
        }
        alerts = DeterminismAlerts(self.replica.trainee.model)
        try:
            self.replica.run_step(self.start0, environment=environment, within=alerts.catching(), trace=False)
        except RuntimeError as error:  # raised above the dispatcher, where no op could be caught
            if "deterministic" not in str(error):
                raise
            alerts.alerts.append({"op": None, "layer": None, "phase": "step", "message": str(error).split("\n")[0]})
        by_op: dict[Any, list[dict[str, Any]]] = {}
        for alert in alerts.alerts:
            places = by_op.setdefault(alert["op"], [])
            if all((alert["layer"], alert["phase"]) != (p["layer"], p["phase"]) for p in places):
                places.append(alert)
        for op, places in by_op.items():  # one finding per op: on CUDA without CUBLAS_WORKSPACE_CONFIG every matmul alerts
            shown = [f"the {p['phase']} pass of {p['layer']}" if p["layer"] else f"the {p['phase']}" for p in places[:4]]
            more = f" and {len(places) - 4} more places" if len(places) > 4 else ""
            evidence = (
                f"step 0 under torch.use_deterministic_algorithms(True): PyTorch reports {op or 'an op'} in {', '.join(shown)}"
                f"{more}: {places[0]['message']}"
            )
            fix = causes.alert_fix(op, places[0]["message"])
            self.findings.append(finding("deterministic-warning", "warning", evidence, fix, layer=places[0]["layer"], op=op))

    def step_changes(self, *, streams: Mapping[str, Any] | None = None, environment: Mapping[str, Any] | None = None) -> str | None:
        """Where step 0 differs when run with other streams or settings (``None``: it does not)."""
        assert self.start0 is not None
        if self._outcome(self.start0, streams=streams, environment=environment) == self.outcome0:
            return None
        found = self._traced_difference(self.start0, streams=streams, environment=environment)
        return _described(*found) if found is not None else "the state after the step"

    def with_stream_advanced(self, name: str) -> str | None:
        """Where step 0 differs when the stream ``name`` starts one draw further."""
        assert self.start0 is not None
        if name not in self.start0.streams:
            return None
        with self.replica.active():
            self.replica.state.streams.load_state_dict(self.start0.streams)
            _draw(name, _sources(self.replica.trainee))
            advanced = self.replica.state.streams.state_dict()[name]
        return self.step_changes(streams={**self.start0.streams, name: advanced})

    def dataset_draws_from(self, name: str, indices: list[int] | None) -> bool | None:
        """Whether the dataset's items at ``indices`` change when the stream ``name`` is one draw
        further (``None``: cannot tell, e.g. not a map-style dataset)."""
        dataset = getattr(self.replica.trainee.loader, "dataset", None)
        sources = _sources(self.replica.trainee)
        if indices is None or not hasattr(dataset, "__getitem__") or (name not in sources and name not in GLOBAL_STREAMS):
            return None
        streams = RandomStreams(sources)

        def contents() -> str:
            tensors, others = batch_tensors([dataset[i] for i in indices])
            return combine_digests([*hash_tensors(tensors).values(), *others])

        with self.replica.active():
            saved = streams.state_dict()
            try:
                before = contents()
                streams.load_state_dict(saved)
                _draw(name, sources)
                return contents() != before
            finally:
                streams.load_state_dict(saved)


def _divergent_ops(a: list[OpRecord], b: list[OpRecord], phases: list[str]) -> list[tuple[str, str | None, str]]:
    """Every op (with its module and phase) whose inputs match and whose outputs differ."""
    found: list[tuple[str, str | None, str]] = []
    for x, y, phase in zip(a, b, phases, strict=False):
        if x.op != y.op:
            break
        if x.inputs == y.inputs and x.outputs != y.outputs and not any(word in x.op for word in _UNINITIALISED):
            key = (x.op, x.layer, phase)
            if key not in found:
                found.append(key)
    return found
