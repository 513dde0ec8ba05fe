"""The Recorder in a process that is a rank: its own folder, rank.json, format 2, resume; here on a
one-rank gloo group (two ranks run end to end in tests/e2e/test_distributed.py)."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from bisect_repro import Recorder, RecordOptions, Run, record
from bisect_repro.errors import RecordingError
from bisect_repro.record.recipe import build


@pytest.fixture
def group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_a_rank_records_its_own_folder_of_a_format_2_run(group, examples, tmp_path) -> None:
    record(
        build(f"{examples / 'mlp.py'}:build"),
        tmp_path / "r",
        RecordOptions(steps=4, every=2, checkpoint_every=2),
    )
    run = Run.open(tmp_path / "r")
    assert run.meta.format == 2 and run.complete and sorted(run.snapshots) == [0, 2, 4]
    assert run.distributed is not None and (
        run.world_size,
        run.layout,
        run.distributed.backend,
    ) == (1, "single", "gloo")
    assert run.rank_meta.rank == 0 and run.rank_meta.environment == run.meta.environment
    assert json.loads((tmp_path / "r" / "rank0" / "rank.json").read_text())["device"] == "cpu"


def test_a_rank_resumes_from_the_checkpoint_the_ranks_agree_on(group, examples, tmp_path) -> None:
    target = f"{examples / 'mlp.py'}:build"
    options = RecordOptions(steps=6, every=2, checkpoint_every=2)
    record(build(target), tmp_path / "whole", options)
    with Recorder(tmp_path / "r", build(target), options) as recorder:
        for batch in recorder.batches():
            recorder.log(recorder.trainee.step(batch))  # type: ignore[misc]
            if recorder.step == 4:
                break  # stopped after 5 of its 6 steps: incomplete
    assert not Run.open(tmp_path / "r").complete
    record(build(target), tmp_path / "r", options, resume=True)
    resumed, whole = Run.open(tmp_path / "r"), Run.open(tmp_path / "whole")
    assert resumed.complete and resumed.meta.resumes[0].step == 4
    assert all(
        resumed.snapshot(s)["hashes"] == whole.snapshot(s)["hashes"] for s in whole.snapshots
    )
    with pytest.raises(RecordingError, match="the run is complete"):
        record(build(target), tmp_path / "r", options, resume=True)
