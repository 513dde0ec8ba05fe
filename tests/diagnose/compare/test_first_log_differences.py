"""The first step at which each logged field differs, and the first batch of a step alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from bisect_repro.diagnose.compare.records import _first_log_differences
from bisect_repro.store.run import Run


def _run(*steps: dict[str, Any]) -> Run:
    return cast(Run, SimpleNamespace(steps={i: {"step": i, **s} for i, s in enumerate(steps)}))


def test_the_first_batch_differs_where_a_steps_first_noted_batch_does() -> None:
    a = _run({"batch": "x"}, {"batch": "y"})
    # run B's step 0 read A's batch first, then two more (updates its gradient scaler skipped)
    b = _run({"batch": "xyz", "first": "x"}, {"batch": "w"})
    assert _first_log_differences(a, b) == {
        "order": None,
        "batch": 0,
        "loss": None,
        "first_batch": 1,
    }
    assert (
        _first_log_differences(a, _run({"batch": "q", "first": "q0"}, {"batch": "y"}))[
            "first_batch"
        ]
        == 0
    )
