"""A framework's rewound step: its kept batches put back in place, and the answer to its run (the
decisions of :mod:`bisect_repro.serve.framework_rewind`, without a process)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bisect_repro.serve.framework_rewind import (
    feed_batch,
    keep_batch,
    refusal_after_rewind,
    rewound_answer,
)
from bisect_repro.serve.requests import Hashes, Request, Run, Skip


def _batch(seed: int, rows: int = 4) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (rows, 6), generator=generator)
    return {"input_ids": ids, "x": [torch.randn(rows, 3, generator=generator)], "mode": "train"}


def test_a_kept_batch_is_copied_into_the_batch_the_framework_drew_in_place() -> None:
    kept = _batch(1)
    copy = keep_batch(kept)
    kept["x"][0].add_(1.0)  # the step changed its batch in place after it was kept
    drawn = _batch(2)
    ids, x = drawn["input_ids"], drawn["x"][0]
    assert feed_batch(copy, drawn) is None
    # the same tensors, which the framework's loop holds
    assert drawn["input_ids"] is ids and drawn["x"][0] is x
    assert torch.equal(ids, _batch(1)["input_ids"]) and torch.equal(x, _batch(1)["x"][0])


@pytest.mark.parametrize(
    ("drawn", "says"),
    [
        # an epoch's last, shorter batch
        (_batch(2, rows=3), "input_ids has another shape or dtype"),
        ({**_batch(2), "mode": "eval"}, "another structure"),
        ({"input_ids": _batch(2)["input_ids"]}, "another structure"),
        (
            {**_batch(2), "input_ids": _batch(2)["input_ids"].float()},
            "input_ids has another shape or dtype",
        ),
    ],
)
def test_a_batch_that_cannot_hold_the_kept_one_is_left_as_drawn_and_says_why(
    drawn: dict[str, Any], says: str
) -> None:
    before = [t.clone() for t in (drawn["input_ids"], *drawn.get("x", []))]
    why = feed_batch(keep_batch(_batch(1)), drawn)
    assert why is not None and says in why
    assert all(
        torch.equal(a, b)
        for a, b in zip(before, (drawn["input_ids"], *drawn.get("x", [])), strict=True)
    )


RESULT = ({"step": 7, "loss": 0.5}, {"trace": []})


@pytest.mark.parametrize(
    ("unfed", "first", "arrival", "answer"),
    [
        (None, (8, 1), (8, 1), RESULT),
        # an epoch ended on the way
        (None, (8, 1), (8, 2), "left the framework's loop elsewhere than its first run did"),
        (
            "fewer batches than its first run",
            (8, 1),
            (8, 1),
            "cannot run the rewound step: fewer batches than its first run",
        ),
    ],
)
def test_a_rewound_steps_run_is_answered_only_where_the_loop_stands_as_after_its_first_run(
    unfed: str | None, first: Any, arrival: Any, answer: Any
) -> None:
    reply = rewound_answer(RESULT, unfed, first, arrival)
    if isinstance(answer, str):
        assert reply[1] is None and answer in reply[0]["error"]
    else:
        assert reply == answer


@pytest.mark.parametrize(
    ("rewound", "request_", "refused"),
    [
        (7, Run(step=7), False),  # the rewound step again
        (7, Run(step=8), True),  # the next step: its batch was drawn and never trained on
        (7, Skip(until=10), True),
        (7, Skip(until=8), False),  # already there
        (7, Hashes(), False),
        (None, Run(step=8), False),  # never rewound: the loop goes on as recorded
        (None, Skip(until=10), False),
    ],
)
def test_a_process_that_rewound_trains_only_the_rewound_step(
    rewound: int | None, request_: Request, refused: bool
) -> None:
    why = refusal_after_rewind(rewound, 8, request_)
    assert (why is not None) is refused and (why is None or "rewound step 7" in why)
