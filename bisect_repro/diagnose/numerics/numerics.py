"""Whether two runs differ by rounding only, and if not, where the difference that matters begins.

1. The distance: at every snapshot both runs hold, the relative L2 distance of all parameters
   (``|B - A| / |A|``) and of each layer's, estimated from the snapshots' sketches
   (:mod:`bisect_repro.capture.sketch`); ``exact`` from the checkpoints where both runs have one
   at that step. A distributed run's sketch of a tensor is its rank 0's (DDP replicas hold the
   whole tensor), or for a DTensor the sum of its ranks' shards, each shard counted once.
2. The envelope (:mod:`bisect_repro.diagnose.numerics.envelope`): how far rounding alone moves this
   training, measured by replaying run A with the rounding changed and nothing else.
3. The decision, by the tables below.

A snapshot's distance is within the envelope when ``relative <= FACTOR * envelope + FLOOR``, the
envelope taken as its largest value up to that step (rounding differences do not shrink back).

With the exact signals (indices, batches, streams, settings, config; typed,
:class:`ExactSignal`) and the distance:

- signals agree, within the envelope at every snapshot: ``rounding_only`` true, no departure;
- signals agree, the distance leaves the envelope at snapshot N: ``rounding_only`` false,
  ``departure`` N, cause ``numerics``;
- signals differ, within the envelope: false, departure at the first step a signal differs,
  cause that signal;
- signals differ, the envelope left at snapshot N: false, departure N, cause the signal that
  explains it (:func:`explaining`: the last to start by the departing step), else ``numerics``;
- signals differ, no envelope measured: false, departure at the first step a signal differs, cause
  that signal;
- signals agree, no envelope measured or no sketches: false, no departure; ``sentence`` says why.

Where signals differ, the envelope is that of the runs' environments alone (run A replayed under
run B's rounding, :mod:`~bisect_repro.diagnose.numerics.envelope`), so the departure is where the
signal's effect first exceeds the environments' rounding.

The departure is located below its snapshot interval where the activations tell: when the forward
pass of the step that started at the last snapshot within (``last_within``) leaves its envelope,
that step is the one that departed (``departed``), and the layer is the first module whose output
does. Otherwise the layer is the one whose weights are the largest multiple of their own envelope
at the first snapshot out of it.

Where the guarantees stop: the envelope is one experiment's measure of rounding, not a bound:
training is chaotic, so every distance grows, and a long enough run leaves any envelope measured
over a shorter one; ``FACTOR`` allows for rounding that differs in more places than the
experiment changed. A departure found between two snapshots is reported at the later one; unless
the forward pass of the step at ``last_within`` shows it, the step that caused it lies between
that snapshot and it, and its layer is the one whose weights moved furthest, which is where the
difference is felt, not necessarily where it entered. The attribution to a signal is by the steps
the records give: a config key acts from step 0, so it explains any departure after it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ...store.run import Run
from ...store.sketches import Sketches, read_sketches
from ..compare.records import Records, layer_of, model_name
from .numerics_result import Departure, Distance, Envelope, Numerics

__all__ = [
    "FACTOR",
    "FLOOR",
    "ExactSignal",
    "Measured",
    "SignalKind",
    "decide",
    "distances",
    "explaining",
    "run_sketches",
    "signals_differing",
]

FACTOR = 10.0
FLOOR = 1e-12  # the float64 sums' own noise, relative: far below any rounding of float32 training

Sketched = dict[str, np.ndarray]


def run_sketches(
    run: Run, step: int, other: Run | None = None
) -> tuple[Sketched | None, Sketches | None]:
    """The sketch of every parameter of the whole run at ``step`` (all ranks; ``None`` where a
    rank's snapshot holds none), and the activation sketches the snapshot holds (rank 0's); named
    as the model names them where ``other`` (the run compared with) has another layout
    (:func:`~bisect_repro.diagnose.compare.records.model_name`)."""
    ranks = [run] if run.distributed is None else [run.open_rank(r) for r in range(run.world_size)]
    found: Sketched = {}
    activations = None
    for rank in ranks:
        if step not in rank.snapshots:
            return None, None
        tree = rank.snapshot(step)
        file = rank.folder / rank.snapshots[step].file
        sketches = read_sketches(tree, file)
        if sketches is None:
            return None, None
        if rank.rank == 0:
            activations = read_sketches(tree, file, "activations")
        placed, meshes = tree.get("dtensors") or {}, tree.get("meshes") or {}
        for recorded, values in sketches.values.items():
            name = model_name(recorded, run, other) if other is not None else recorded
            if recorded in placed:  # a shard: the ranks' sketches add up, each replica counted once
                share = values / _replicas(placed[recorded], meshes)
                found[name] = found[name] + share if name in found else share
            elif name not in found:  # replicated whole: rank 0's
                found[name] = values
    return found, activations


def _replicas(placement: Mapping[str, object], meshes: Mapping[str, object]) -> int:
    """How many ranks hold the same shard of a DTensor: the mesh's size along its ``R``
    dimensions."""
    mesh = meshes.get(str(placement.get("mesh")))
    shape = mesh.get("shape") if isinstance(mesh, dict) else None
    placements = placement.get("placements")
    if (
        not isinstance(shape, list)
        or not isinstance(placements, list)
        or len(shape) != len(placements)
    ):
        return 1
    return math.prod(int(size) for size, p in zip(shape, placements, strict=True) if p == "R")


def _relative(a: Sketched, b: Sketched, names: list[str]) -> float:
    moved = sum(float(np.sum((b[n] - a[n]) ** 2)) for n in names)
    norm = sum(float(np.sum(a[n] ** 2)) for n in names)
    return math.sqrt(moved / norm) if norm > 0 else (0.0 if moved == 0 else math.inf)


def distance_at(step: int, a: Sketched, b: Sketched) -> Distance:
    """The distance of ``b`` from ``a`` (all weights, and per layer) from their sketches."""
    shared = [n for n in a if n in b and a[n].shape == b[n].shape]
    layers: dict[str, list[str]] = {}
    for name in shared:
        layers.setdefault(layer_of(name) or "(model)", []).append(name)
    return Distance(
        step=step,
        relative=_relative(a, b, shared),
        layers={layer: _relative(a, b, names) for layer, names in layers.items()},
    )


def _exact(a: Run, b: Run, step: int) -> float | None:
    """The exact relative distance of all parameters from both runs' checkpoints at ``step``."""
    if a.distributed or b.distributed or step not in a.checkpoints or step not in b.checkpoints:
        return None
    names = a.meta.model.get("parameters", {})
    ma, mb = a.checkpoint(step)["model"], b.checkpoint(step)["model"]
    shared = [
        n
        for n in names
        if n in ma and n in mb and ma[n].shape == mb[n].shape and ma[n].is_floating_point()
    ]
    moved = sum(float((mb[n].double() - ma[n].double()).square().sum()) for n in shared)
    norm = sum(float(ma[n].double().square().sum()) for n in shared)
    return math.sqrt(moved / norm) if norm > 0 else None


@dataclass
class Measured:
    """The distance of run B from run A: weights at each snapshot; activations at each step that
    both runs sketched them in (one per snapshot interval), per module in A's order."""

    weights: list[Distance] = field(default_factory=list)
    activations: list[Distance] = field(default_factory=list)


def distances(a: Run, b: Run, *, exact: bool = True) -> Measured | None:
    """The distances at every snapshot both runs hold with sketches of parameters of the same name;
    ``None`` when they hold none.
    ``exact`` at the first and the last checkpoint both runs hold (:func:`add_exact`)."""
    found = Measured()
    same_batches = a.world_size == b.world_size
    for step in sorted(set(a.snapshots) & set(b.snapshots)):
        (sa, aa), (sb, ab) = run_sketches(a, step, b), run_sketches(b, step, a)
        # no parameter of the same name: nothing to measure
        if sa is None or sb is None or not sa.keys() & sb.keys():
            continue
        found.weights.append(distance_at(step, sa, sb))
        if (
            same_batches
            and aa is not None
            and ab is not None
            and aa.step == ab.step
            and aa.step is not None
        ):
            found.activations.append(_activation_distance(aa.step, aa.values, ab.values))
    if exact:
        add_exact(found, a, b)
    return found if found.weights else None


def add_exact(measured: Measured, a: Run, b: Run) -> None:
    """The exact distance, from both runs' checkpoints, at the first and the last checkpoint both
    hold: each reads two checkpoints whole, so it is taken only where the numerics measure an
    envelope (:func:`~bisect_repro.diagnose.numerics.envelope.judge`)."""
    both = sorted(set(a.checkpoints) & set(b.checkpoints))
    checked = {both[0], both[-1]} if both else set()
    for point in measured.weights:
        if point.step in checked:
            point.exact = _exact(a, b, point.step)


def _activation_distance(step: int, a: Sketched, b: Sketched) -> Distance:
    shared = [n for n in a if n in b and a[n].shape == b[n].shape]
    return Distance(
        step=step,
        relative=_relative(a, b, shared),
        layers={n: _relative(a, b, [n]) for n in shared},
    )


class SignalKind(Enum):
    """The kinds of exact signal that tell two runs apart, whatever the rounding."""

    ORDER = "sample indices"
    BATCH = "batch contents"
    STREAMS = "random streams"
    SETTINGS = "settings"
    CONFIG = "config"


@dataclass(frozen=True)
class ExactSignal:
    """One exact signal that differs between the runs: its kind, the first step it does, and what
    differs in it (the config's keys, the streams' names)."""

    kind: SignalKind
    step: int
    names: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        """The signal as ``numerics`` names it: ``config (degrade_at)``, ``sample indices``."""
        return f"{self.kind.value} ({', '.join(self.names)})" if self.names else self.kind.value

    @property
    def since(self) -> str:
        """When it differs from, in words: a config from the start (its launch), not a step's
        computation; the others from the first step whose records show it."""
        return "from the start" if self.kind is SignalKind.CONFIG else f"from step {self.step}"


_LOGGED = {"order": SignalKind.ORDER, "batch": SignalKind.BATCH}


def signals_differing(records: Records, *, config_only: bool = False) -> list[ExactSignal]:
    """The exact signals that differ between the runs, each with the first step it does, in the
    order of those steps (``config_only``: the config's alone)."""
    differences = records.differences
    config = (
        [ExactSignal(SignalKind.CONFIG, 0, tuple(differences.config))] if differences.config else []
    )
    if config_only:
        return config
    found = [
        ExactSignal(_LOGGED[key], step)
        for key, step in records.logs.items()
        if key in _LOGGED and step is not None
    ]
    unused = set(records.unused_streams())
    streams = next((row for row in records.timeline if set(row.streams) - unused), None)
    if streams is not None:
        named = tuple(s for s in streams.streams if s not in unused)
        found.append(ExactSignal(SignalKind.STREAMS, streams.step, named))
    if differences.settings is not None:
        found.append(ExactSignal(SignalKind.SETTINGS, differences.settings.step))
    return sorted([*config, *found], key=lambda s: (s.step, s.kind.value))


def explaining(signals: list[ExactSignal], departed: int) -> ExactSignal | None:
    """The signal that explains a departure in training step ``departed`` (or earlier): of those
    in effect by that step, the last to start (a config key acts from step 0; a stream that first
    differs later is nearer the departure); ``None`` where none is."""
    started = [s for s in signals if s.step <= departed]
    return max(started, key=lambda s: s.step) if started else None


@dataclass(frozen=True)
class _Bound:
    """The envelope as a running maximum, overall and per layer, at a step."""

    overall: float
    layers: dict[str, float]


def _bounds(points: list[Distance]) -> dict[int, _Bound]:
    found: dict[int, _Bound] = {}
    overall, layers = 0.0, dict[str, float]()
    for point in sorted(points, key=lambda p: p.step):
        overall = max(overall, point.relative)
        layers = {
            k: max(layers.get(k, 0.0), point.layers.get(k, 0.0)) for k in {*layers, *point.layers}
        }
        found[point.step] = _Bound(overall, layers)
    return found


def _bound_at(bounds: dict[int, _Bound], step: int) -> _Bound:
    earlier = [s for s in bounds if s <= step]
    return bounds[max(earlier)] if earlier else _Bound(0.0, {})


def _within(distance: float, envelope: float) -> bool:
    return distance <= FACTOR * envelope + FLOOR


def _departing_layer(point: Distance, bound: _Bound) -> str | None:
    """The layer whose weights are the largest multiple of their own envelope."""
    ratios = {
        layer: d / (FACTOR * bound.layers.get(layer, 0.0) + FLOOR)
        for layer, d in point.layers.items()
    }
    return max(ratios, key=lambda layer: (ratios[layer], point.layers[layer]), default=None)


def _entering_module(measured: Measured, envelope: Envelope, step: int | None) -> str | None:
    """The first module, in the order the modules ran, whose output leaves its envelope in the
    forward pass of ``step`` (the last step that started within the envelope); ``None`` when
    none does or the activations were not sketched there."""
    point = next((p for p in measured.activations if p.step == step), None)
    if point is None or step is None:
        return None
    bound = (
        _bound_at(_bounds(envelope.activations), step) if envelope.activations else _Bound(0.0, {})
    )
    return next(
        (
            module
            for module, d in point.layers.items()
            if not _within(d, bound.layers.get(module, 0.0))
        ),
        None,
    )


def decide(
    measured: Measured | None,
    envelope: Envelope | None,
    signals: list[ExactSignal],
    why_none: str | None,
) -> Numerics:
    """The decision table of the module docstring."""
    named = [signal.what for signal in signals]
    if measured is None:
        why = (
            "the runs hold no sketches of parameters they both name (recorded before sketches "
            "existed, or named otherwise): no distance"
        )
        return Numerics(rounding_only=False, signals=named, sentence=why)
    points = measured.weights
    if envelope is None:
        why = why_none or "no replay"
        numerics = Numerics(
            rounding_only=False,
            distance=points,
            signals=named,
            sentence=f"no rounding envelope was measured ({why})",
        )
        if signals:
            numerics.departure = Departure(
                step=signals[0].step, layer=None, relative=0.0, envelope=0.0, cause=named[0]
            )
        return numerics
    bounds = _bounds(envelope.points)
    out = next(
        (p for p in points if not _within(p.relative, _bound_at(bounds, p.step).overall)), None
    )
    numerics = Numerics(
        rounding_only=out is None and not signals, distance=points, envelope=envelope, signals=named
    )
    if out is not None:
        numerics.departure = _departure(measured, envelope, signals, out, bounds)
    elif signals:
        numerics.departure = Departure(
            step=signals[0].step,
            layer=None,
            relative=0.0,
            envelope=_bound_at(bounds, signals[0].step).overall,
            cause=named[0],
        )
    numerics.sentence = _sentence(numerics, envelope, points)
    return numerics


def _departure(
    measured: Measured,
    envelope: Envelope,
    signals: list[ExactSignal],
    out: Distance,
    bounds: dict[int, _Bound],
) -> Departure:
    """The departure at ``out``, the first snapshot beyond the envelope: located to the training
    step that started at the last snapshot within where that step's forward pass leaves the
    envelope, at the first module whose output does; else to the snapshot interval, at the layer
    whose weights are furthest out. Its cause is the signal that explains it
    (:func:`explaining`), else ``numerics``."""
    bound = _bound_at(bounds, out.step)
    within = [p.step for p in measured.weights if p.step < out.step]
    last = within[-1] if within else None
    entering = _entering_module(measured, envelope, last)
    departed = last if entering is not None else None
    signal = explaining(signals, out.step - 1 if departed is None else departed)
    return Departure(
        step=out.step,
        layer=entering or _departing_layer(out, bound),
        relative=out.relative,
        envelope=bound.overall,
        cause=signal.what if signal is not None else "numerics",
        last_within=last,
        departed=departed,
    )


def _sentence(numerics: Numerics, envelope: Envelope, points: list[Distance]) -> str:
    measured = (
        f"the envelope measured by replaying run A from step {envelope.from_step} with "
        f"{envelope.method}"
    )
    if numerics.rounding_only:
        last = points[-1]
        return (
            f"the runs differ by rounding only, within {measured} (relative distance "
            f"{last.relative:.2g} at step {last.step})"
        )
    departure = numerics.departure
    assert departure is not None
    if departure.layer is None:
        return (
            f"the weights stay within {measured}, but {departure.cause} differ from step "
            f"{departure.step}: not rounding alone"
        )
    until = (
        f"until step {departure.last_within}"
        if departure.last_within is not None
        else "from the start"
    )
    where = (
        f"at step {departure.step} layer {departure.layer} departs"
        if departure.departed is None
        else f"in step {departure.departed} layer {departure.layer} departs, its output out of its "
        "envelope in that step's forward pass"
    )
    return (
        f"they differ by rounding {until}; {where} "
        f"(relative distance {departure.relative:.2g} at step {departure.step}, {FACTOR:g} times "
        f"{measured} is {FACTOR * departure.envelope:.2g}): cause {departure.cause}"
    )
