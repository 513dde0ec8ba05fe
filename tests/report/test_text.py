"""The text report's one-line replay summary agrees with where the replay parted from its
records."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from rich.console import Console

from bisect_repro.diagnose.compare.verdict import CompareResult
from bisect_repro.report.text import render_comparison

RESEED = json.loads((Path(__file__).parent / "reseed.json").read_text())


def rendered(**replay: object) -> str:
    result = copy.deepcopy(RESEED)
    result["replay"].update(replay)
    console = Console(record=True, width=400, color_system=None)
    render_comparison(CompareResult.from_json(result), console)
    return console.export_text()


@pytest.mark.parametrize(
    ("faithful", "parted", "says"),
    [
        (True, [], "reproduced both runs' records"),
        (
            True,
            [{"run": "B", "step": 14, "what": "loss"}],
            "reproduced both runs' records before the divergent step (then run B at step 14",
        ),
        (
            False,
            [{"run": "B", "step": 9, "what": "loss"}],
            "did not reproduce the records exactly (run B at step 9)",
        ),
    ],
)
def test_the_replay_summary_says_where_the_replay_parted(
    faithful: bool, parted: list, says: str
) -> None:
    text = rendered(performed=True, faithful=faithful, parted=parted)
    assert says in text
    if parted:
        assert (
            "reproduced both runs' records\n" not in text
            and "reproduced both runs' records;" not in text
        )


def test_a_stream_nothing_drew_from_is_marked_unused_and_one_drawn_from_is_not() -> None:
    result = copy.deepcopy(RESEED)
    result["timeline"][0]["streams"] = ["python", "torch"]
    result["unused_streams"] = ["python"]
    console = Console(record=True, width=400, color_system=None)
    render_comparison(CompareResult.from_json(result), console)
    text = console.export_text()
    assert "python (unused), torch" in text
    assert "torch (unused)" not in text
