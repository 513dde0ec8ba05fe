"""What a seeding call from entropy produced is recorded with it, and a replay gives it back: the
same draws follow, once per recorded call, only to the same call at the same call site."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from bisect_repro.capture.entropy import EntropyFeed, check_value
from bisect_repro.capture.seeding import SeedingCall, SeedingWatch


def _draws() -> list[Any]:
    torch.seed()
    a = torch.rand(3).tolist()
    random.seed()
    b = random.random()
    np.random.seed()
    c = float(np.random.normal())  # a cached Gaussian is part of the state
    d = float(np.random.default_rng().random())
    e = random.Random().random()
    return [a, b, c, d, e]


def _watched(feed: EntropyFeed | None = None) -> tuple[list[Any], list[SeedingCall]]:
    watch = SeedingWatch()
    watch.feed = feed
    watch.install()
    try:
        return _draws(), watch.calls
    finally:
        watch.uninstall()


def test_each_call_from_entropy_is_given_back_the_value_its_run_recorded_once() -> None:
    recorded, calls = _watched()
    logged = [call.to_record() for call in calls]
    assert all(check_value(c["call"], c["value"]) is None for c in logged), logged
    assert [c["call"] for c in logged] == [
        "torch.seed()",
        "random.seed()",
        "np.random.seed()",
        "np.random.default_rng()",
        "random.Random.seed()",
    ]
    feed = EntropyFeed.of_steps({3: {"seeded": logged}}, 0, lambda: 3)
    replayed, seen = _watched(feed)
    assert replayed == recorded
    assert [c.replayed for c in seen] == ["recorded"] * 5 and "value" not in seen[0].to_json()
    again, seen = _watched(feed)  # each recorded value is given once: a repeat draws from entropy
    assert [c.replayed for c in seen] == ["beyond"] * 5 and again[0] != recorded[0]


def test_a_step_rewound_is_given_its_recorded_values_again_and_earlier_steps_are_not() -> None:
    recorded, calls = _watched()
    logged = [call.to_record() for call in calls]
    now = {"step": 2}
    feed = EntropyFeed.of_steps(
        {2: {"seeded": logged[:1]}, 3: {"seeded": logged[1:]}}, 0, lambda: now["step"]
    )
    _watched(feed)  # step 2 takes its one recorded call
    now["step"] = 3
    replayed, seen = _watched(feed)
    assert [c.replayed for c in seen] == ["other"] + ["recorded"] * 4 and replayed[1:] == recorded[
        1:
    ]
    feed.give_again(3)  # rewound to step 3: its calls are given again, step 2's stay given
    again, seen = _watched(feed)
    assert [c.replayed for c in seen] == ["other"] + ["recorded"] * 4 and again[1:] == recorded[1:]


def test_a_recorded_value_is_never_given_to_another_call_site_or_step() -> None:
    _, calls = _watched()
    logged = [{**call.to_record(), "where": "elsewhere.py:1"} for call in calls]
    _, seen = _watched(EntropyFeed.of_steps({3: {"seeded": logged}}, 0, lambda: 3))
    assert [c.replayed for c in seen] == ["other"] * 5
    _, seen = _watched(
        EntropyFeed.of_steps({3: {"seeded": [c.to_record() for c in calls]}}, 0, lambda: 4)
    )
    assert [c.replayed for c in seen] == ["beyond"] * 5


def test_from_the_step_kept_on_a_reseed_leaves_its_stream_as_it_is() -> None:
    watch = SeedingWatch()
    now = {"step": 2}
    watch.feed = EntropyFeed([], lambda: now["step"], kept_from=3)
    watch.install()
    try:
        torch.manual_seed(5)
        expected = torch.rand(2)
        torch.manual_seed(5)
        torch.seed()  # step 2: drawn from entropy
        assert not torch.equal(torch.rand(2), expected) and watch.calls[-1].replayed == "beyond"
        torch.manual_seed(5)
        now["step"] = 3
        assert torch.seed() == torch.initial_seed() == 5
        assert torch.equal(torch.rand(2), expected) and watch.calls[-1].replayed == "kept"
    finally:
        watch.uninstall()


_STATE = {"mt19937": "00" * 2496, "pos": 624, "gauss": None}


@pytest.mark.parametrize(
    ("call", "value", "wrong"),
    [
        ("torch.seed()", 2**64 - 1, False),
        ("torch.seed()", 2**64, True),
        ("torch.seed()", -1, True),
        ("torch.seed()", "7", True),
        ("torch.seed()", True, True),
        ("np.random.default_rng()", 2**127, False),
        ("np.random.default_rng()", 1.0, True),
        ("np.random.seed()", _STATE, False),
        ("random.seed()", {**_STATE, "gauss": 0.5}, False),
        ("random.seed()", {**_STATE, "pos": 625}, True),
        ("random.seed()", {**_STATE, "mt19937": "zz" * 2496}, True),
        ("random.seed()", {**_STATE, "mt19937": "00"}, True),
        ("np.random.seed()", 3, True),
        ("torch.manual_seed(3)", 3, True),
    ],
)
def test_a_recorded_value_is_checked_against_what_its_call_produces(
    call: str, value: Any, wrong: bool
) -> None:
    assert (check_value(call, value) is not None) is wrong
