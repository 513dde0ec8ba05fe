"""The numerics decision table, against made-up distances and envelopes, and the checks on a
snapshot's sketches at read."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
import torch

from bisect_repro.diagnose.compare.records import model_name, rank_zero_alike
from bisect_repro.diagnose.compare.verdict import CompareResult
from bisect_repro.diagnose.numerics import numerics
from bisect_repro.diagnose.numerics.numerics import (
    FACTOR,
    ExactSignal,
    Measured,
    SignalKind,
    _replicas,
    decide,
    distance_at,
    explaining,
)
from bisect_repro.diagnose.numerics.numerics_result import Distance, Envelope, Numerics
from bisect_repro.errors import RunFormatError
from bisect_repro.store.run import Run
from bisect_repro.store.sketches import read_sketches


def _points(values: list[float], layers: dict[str, list[float]] | None = None) -> list[Distance]:
    layers = layers or {"1": values}
    return [
        Distance(step=s, relative=v, layers={k: vs[s] for k, vs in layers.items()})
        for s, v in enumerate(values)
    ]


_ROUNDING = [0.0, 1e-8, 2e-8, 3e-8, 4e-8]
ENVELOPE = Envelope(
    method="2 torch threads instead of 1",
    from_step=0,
    points=_points(_ROUNDING, {"1": _ROUNDING, "3": _ROUNDING}),
)


def test_within_the_envelope_with_every_signal_agreeing_is_rounding_only() -> None:
    numerics = decide(Measured(_points([0.0, 2e-8, 5e-8, 1e-7, 3e-7])), ENVELOPE, [], None)
    assert numerics.rounding_only and numerics.departure is None
    assert (
        "rounding only" in numerics.sentence and "2 torch threads instead of 1" in numerics.sentence
    )


def test_the_envelope_is_its_running_maximum() -> None:
    dipping = Envelope(method="m", from_step=0, points=_points([0.0, 1e-7, 1e-12, 1e-12, 1e-12]))
    assert decide(Measured(_points([0.0, 1e-7, 5e-7, 9e-7, 9e-7])), dipping, [], None).rounding_only


def test_leaving_the_envelope_is_a_departure_at_that_snapshot() -> None:
    layers = {"1": [0.0, 1e-8, 2e-8, 1e-4, 2e-4], "3": [0.0, 1e-8, 2e-8, 5e-6, 1e-5]}
    numerics = decide(Measured(_points([0.0, 1e-8, 2e-8, 1e-4, 2e-4], layers)), ENVELOPE, [], None)
    assert not numerics.rounding_only
    departure = numerics.departure
    assert departure is not None and (departure.step, departure.last_within, departure.cause) == (
        3,
        2,
        "numerics",
    )
    # no activations: the layer whose weights moved furthest beyond the envelope
    assert departure.layer == "1"
    assert "until step 2" in numerics.sentence and "layer 1 departs" in numerics.sentence


def test_the_departing_layer_is_the_first_module_whose_output_leaves_its_envelope() -> None:
    weights = _points(
        [0.0, 1e-8, 2e-8, 1e-4, 2e-4],
        {"1": [0.0, 1e-8, 2e-8, 1e-4, 2e-4], "3": [0.0, 1e-8, 2e-8, 5e-6, 1e-5]},
    )
    forward = {"0": 1e-9, "1": 1e-7, "2": 1e-7, "3": 2e-3, "4": 1e-3, "5": 1e-3}
    envelope_forward = dict.fromkeys(forward, 1e-7) | {"0": 1e-9}
    activations = [Distance(step=2, relative=1e-3, layers=forward)]
    sketched = [Distance(step=2, relative=1e-7, layers=envelope_forward)]
    envelope = Envelope(method="m", from_step=0, points=ENVELOPE.points, activations=sketched)
    departure = decide(Measured(weights, activations), envelope, [], None).departure
    assert departure is not None and departure.layer == "3"


def test_an_exact_signal_that_differs_is_never_rounding_only() -> None:
    numerics = decide(
        Measured(_points([0.0, 1e-8, 2e-8, 3e-8, 4e-8])),
        ENVELOPE,
        [ExactSignal(SignalKind.ORDER, 2)],
        None,
    )
    assert not numerics.rounding_only
    assert (
        numerics.departure is not None
        and numerics.departure.step == 2
        and numerics.departure.cause == "sample indices"
    )
    assert numerics.departure.layer is None and "sample indices" in numerics.sentence


def test_without_an_envelope_a_differing_signal_is_still_the_departure() -> None:
    numerics = decide(
        Measured(_points([0.0, 1e-3])),
        None,
        [ExactSignal(SignalKind.BATCH, 1)],
        "batch contents differ from step 1",
    )
    assert not numerics.rounding_only and numerics.departure is not None
    assert (numerics.departure.step, numerics.departure.layer, numerics.departure.cause) == (
        1,
        None,
        "batch contents",
    )


def test_no_envelope_and_no_sketches_decide_nothing() -> None:
    none = decide(
        Measured(_points([0.0, 1e-8])),
        None,
        [],
        "run A is a script; the envelope is measured for recipes",
    )
    assert (
        not none.rounding_only
        and none.departure is None
        and "is a script" in none.sentence
        and len(none.distance) == 2
    )
    old = decide(None, ENVELOPE, [], None)
    assert not old.rounding_only and old.distance == [] and "no sketches" in old.sentence


def test_distance_from_sketches_is_relative_per_layer_and_overall() -> None:
    a = {
        "0.weight": np.array([3.0, 4.0]),
        "0.bias": np.array([0.0, 0.0]),
        "2.weight": np.array([1.0, 0.0]),
    }
    b = {
        "0.weight": np.array([3.0, 4.5]),
        "0.bias": np.array([0.0, 0.0]),
        "2.weight": np.array([1.0, 0.0]),
    }
    point = distance_at(4, a, b)
    assert point.step == 4 and point.layers == {"0": pytest.approx(0.1), "2": 0.0}
    assert point.relative == pytest.approx(0.5 / np.sqrt(26.0))


def test_a_shard_counts_once_however_many_ranks_replicate_it() -> None:
    meshes = {"0": {"shape": [2, 3]}}
    assert _replicas({"placements": ["S(0)", "R"], "mesh": "0"}, meshes) == 3
    assert _replicas({"placements": ["S(0)", "S(1)"], "mesh": "0"}, meshes) == 1


def test_numerics_reads_back_from_json() -> None:
    numerics = decide(Measured(_points([0.0, 1e-8, 2e-8, 1e-4, 2e-4])), ENVELOPE, [], None)
    result = CompareResult(runs=["a", "b"], numerics=numerics)
    found = result.to_json()["numerics"]
    assert set(found) >= {"rounding_only", "departure", "distance"}
    assert found["distance"][3] == {
        "step": 3,
        "relative": 1e-4,
        "exact": None,
        "layers": {"1": 1e-4},
    }
    assert found["departure"]["step"] == 3 and found["departure"]["layer"] == "1"
    back = CompareResult.from_json(result.to_json()).numerics
    assert isinstance(back, Numerics) and back.to_json() == found
    assert FACTOR * found["departure"]["envelope"] < found["departure"]["relative"]


def _tree(**sketch: object) -> dict:
    return {
        "sketch": {
            "width": 4,
            "seed": 1,
            "names": ["a", "b"],
            "values": torch.zeros(2, 4, dtype=torch.float64),
        }
        | sketch
    }


def test_sketches_are_read_whole_or_refused(tmp_path: Path) -> None:
    read = read_sketches(_tree(), tmp_path / "s")
    assert read is not None and list(read.values) == ["a", "b"] and read.values["a"].shape == (4,)
    assert read_sketches({}, tmp_path / "s") is None  # a run recorded before sketches
    bad = [
        {"width": 0},
        {"width": True},
        {"names": ["a", "a"]},
        {"names": ["a", 3]},
        {"values": torch.zeros(2, 4)},
        {"values": torch.zeros(3, 4, dtype=torch.float64)},
        {"values": [[0.0] * 4] * 2},
    ]
    for change in bad:
        with pytest.raises(RunFormatError, match="the file is damaged"):
            read_sketches(_tree(**change), tmp_path / "s")
    activations = {"activations": _tree()["sketch"] | {"step": -1}}
    with pytest.raises(RunFormatError, match="activations step"):
        read_sketches(activations, tmp_path / "s", "activations")


def _run(layout: str, world_size: int) -> Run:
    return cast(Run, SimpleNamespace(layout=layout, world_size=world_size))


def test_a_ddp_wrapper_s_prefix_is_dropped_only_against_another_layout() -> None:
    ddp, fsdp, single = _run("ddp", 2), _run("fsdp", 2), _run("single", 1)
    assert (
        model_name("module.0.weight", ddp, fsdp) == "0.weight"
        and model_name("module.0.weight", ddp, single) == "0.weight"
    )
    # both wrapped: both keep it
    assert model_name("module.0.weight", ddp, _run("ddp", 1)) == "module.0.weight"
    # a model's own submodule named module
    assert model_name("module.0.weight", fsdp, ddp) == "module.0.weight"
    assert model_name("0.weight", ddp, fsdp) == "0.weight"


@pytest.mark.parametrize(
    ("a", "b", "alike"),
    [
        (("ddp", 1), ("ddp", 2), True),  # every rank holds the whole tensors
        (("single", 1), ("single", 2), True),
        (("fsdp", 2), ("fsdp", 2), True),
        (("fsdp", 2), ("fsdp", 4), False),  # other shards
        (("ddp", 2), ("fsdp", 2), False),  # whole tensors against shards
        (("single", 1), ("ddp", 1), False),  # other names
    ],
)
def test_rank_zero_hashes_compare_only_where_both_hold_the_same_tensors(
    a: tuple[str, int], b: tuple[str, int], alike: bool
) -> None:
    assert rank_zero_alike(_run(*a), _run(*b)) is alike


def test_runs_that_name_no_parameter_alike_have_no_distance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sketches under other names compare nothing: not a distance of zero, which reads as equal
    weights."""
    names = {"a": ["module.0.weight"], "b": ["0.weight"]}

    def sketches(
        run: SimpleNamespace, step: int, other: object = None
    ) -> tuple[dict[str, np.ndarray], None]:
        return {name: np.full(4, float(step + 1)) for name in names[run.tag]}, None

    monkeypatch.setattr(numerics, "run_sketches", sketches)
    a, b = (
        cast(Run, SimpleNamespace(tag=tag, world_size=1, snapshots={0: 0, 1: 1}, checkpoints={}))
        for tag in "ab"
    )
    assert numerics.distances(a, b) is None
    names["b"] = ["module.0.weight"]
    measured = numerics.distances(a, b)
    assert measured is not None and [p.relative for p in measured.weights] == [0.0, 0.0]


def _departing_forward() -> tuple[Measured, Envelope]:
    """Weights that leave the envelope at snapshot 4, and the forward pass of step 3 (sketched in
    snapshot 4), whose layer ``3`` output is out of its envelope."""
    weights = _points(
        [0.0, 1e-8, 2e-8, 3e-8, 2e-4],
        {"1": [0.0, 1e-8, 2e-8, 3e-8, 1e-5], "3": [0.0, 1e-8, 2e-8, 3e-8, 2e-4]},
    )
    forward = {"1": 1e-7, "2": 1e-7, "3": 2e-3, "4": 1e-3}
    activations = [Distance(step=3, relative=1e-3, layers=forward)]
    sketched = [Distance(step=3, relative=1e-7, layers=dict.fromkeys(forward, 1e-7))]
    envelope = Envelope(method="m", from_step=0, points=ENVELOPE.points, activations=sketched)
    return Measured(weights, activations), envelope


def test_a_config_key_departs_beyond_the_environments_envelope_at_its_step_and_layer() -> None:
    measured, envelope = _departing_forward()
    config = ExactSignal(SignalKind.CONFIG, 0, ("degrade_at",))
    numerics = decide(measured, envelope, [config], None)
    departure = numerics.departure
    assert not numerics.rounding_only and numerics.signals == ["config (degrade_at)"]
    assert departure is not None
    assert (departure.step, departure.last_within, departure.departed, departure.layer) == (
        4,
        3,
        3,
        "3",
    )
    assert departure.cause == "config (degrade_at)"
    assert "until step 3; in step 3 layer 3 departs" in numerics.sentence
    assert numerics.sentence.endswith("cause config (degrade_at)")


def test_a_departure_not_seen_in_the_forward_pass_stays_located_to_its_snapshot_interval() -> None:
    measured, envelope = _departing_forward()
    measured.activations = []
    departure = decide(
        measured, envelope, [ExactSignal(SignalKind.CONFIG, 0, ("lr",))], None
    ).departure
    assert departure is not None and departure.departed is None
    assert (departure.step, departure.last_within, departure.layer) == (4, 3, "3")
    assert departure.cause == "config (lr)"


def test_the_signal_that_explains_a_departure_is_the_last_in_effect_by_its_step() -> None:
    config = ExactSignal(SignalKind.CONFIG, 0, ("degrade_at",))
    streams = ExactSignal(SignalKind.STREAMS, 3, ("torch",))
    later = ExactSignal(SignalKind.ORDER, 9)
    assert explaining([config, streams, later], 3) == streams
    assert explaining([config, streams, later], 2) == config
    assert explaining([later], 3) is None
    measured, envelope = _departing_forward()
    # a signal that starts after the departing step does not explain it
    departure = decide(measured, envelope, [later], None).departure
    assert departure is not None and departure.cause == "numerics"
    assert streams.what == "random streams (torch)" and later.what == "sample indices"
