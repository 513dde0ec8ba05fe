"""The step log's records: a step that notes several batches keeps its first one's digest too."""

from __future__ import annotations

from bisect_repro.capture.batch import combine_digests
from bisect_repro.record.steplog import PendingStep, step_records

DIGESTS = {"0.0:x": "aa", "0.1:x": "bb", "0.2:x": "cc"}


def test_a_step_of_several_batches_logs_its_first_batch_alone_too() -> None:
    one = PendingStep(0, None, ["0.0:x"], [])
    several = PendingStep(0, None, ["0.0:x", "0.1:x", "0.2:x"], ["tag"], first=(1, 0))
    [a, b] = step_records([one, several], [None, None], DIGESTS, {})
    assert "first" not in a and a["batch"] == combine_digests(["aa"])
    assert b["batch"] == combine_digests(["aa", "bb", "cc", "tag"])
    assert b["first"] == a["batch"]  # the first batch alone: the one-batch step's
