"""``show``'s summary of a run: typed, with the ``bisect-repro/show/1`` object only as its JSON
form."""

from __future__ import annotations

import io
import json

from rich.console import Console

from bisect_repro.diagnose.show.drift import RankDrift
from bisect_repro.diagnose.show.summary import RankStatus, RunSummary, run_summary
from bisect_repro.report.html import summary_html
from bisect_repro.report.text import render_summary
from bisect_repro.store.run import Run
from bisect_repro.store.writer import RunWriter
from tests.fakes import fake_ranks

KEYS = [
    "schema",
    "path",
    "format",
    "target",
    "config",
    "options",
    "recorded_by_you",
    "edited",
    "complete",
    "steps_logged",
    "last_step",
    "snapshots",
    "checkpoints",
    "streams",
    "tensors_hashed",
    "verified",
    "first_loss",
    "last_loss",
    "bytes",
    "model",
    "loader",
    "environment",
    "command",
    "cwd",
    "script",
    "script_sha256",
]


def one_process(path, *, losses=(2.0, None, 1.5, 1.0), finish: bool = True):
    meta = {
        "target": "train.py:build",
        "config": {"lr": 0.1},
        "model": {"parameters": {"w": [[2], "float32"]}},
        "environment": {},
    }
    writer = RunWriter.create(path, meta)
    writer.append_steps(
        [{"step": s, "loss": loss, "order": "o", "batch": "b"} for s, loss in enumerate(losses)]
    )
    for step in (0, 2):
        writer.commit(
            "snapshot",
            step,
            {
                "step": step,
                "hashes": {"w": "x"},
                "streams": {"torch": {}, "python": {}},
                "data": {},
            },
        )
    writer.commit("checkpoint", 0, {"w": [1.0, 2.0]})
    if finish:
        writer.finish(2)
    writer.close()
    return path


def rendered(summary: RunSummary) -> str:
    console = Console(file=io.StringIO(), width=300)
    render_summary(summary, console)
    return console.file.getvalue()


def test_a_single_process_run_is_summarised(tmp_path) -> None:
    summary = run_summary(Run.open(one_process(tmp_path / "a")))
    assert (summary.path, summary.target, summary.config) == (
        str(tmp_path / "a"),
        "train.py:build",
        {"lr": 0.1},
    )
    assert (summary.complete, summary.steps_logged, summary.last_step) == (True, 4, 2)
    assert (summary.snapshots, summary.checkpoints, summary.streams, summary.tensors_hashed) == (
        [0, 2],
        [0],
        ["python", "torch"],
        1,
    )
    # a step without a loss is skipped
    assert (summary.first_loss, summary.last_loss, summary.verified) == (2.0, 1.0, None)
    assert (
        summary.snapshot_bytes > 0
        and summary.checkpoint_bytes > 0
        and summary.model == {"parameters": 1}
    )
    assert summary.distributed is None and summary.ranks == [] and summary.replicas is None
    assert run_summary(Run.open(tmp_path / "a"), verify=True).verified == 3


def test_its_json_is_the_show_object_in_its_order(tmp_path) -> None:
    summary = run_summary(Run.open(one_process(tmp_path / "a", finish=False)))
    found = summary.to_json()
    assert list(found) == KEYS and found["schema"] == "bisect-repro/show/1"
    assert found["bytes"] == {
        "snapshots": summary.snapshot_bytes,
        "checkpoints": summary.checkpoint_bytes,
    }
    assert found["complete"] is False and json.loads(json.dumps(found)) == found
    assert "incomplete (last complete step 2)" in rendered(summary)


def test_a_distributed_run_adds_its_ranks_and_replicas_last(tmp_path) -> None:
    hashes = {0: {0: {"w": "a"}, 2: {"w": "b"}}, 1: {0: {"w": "a"}, 2: {"w": "B"}}}
    summary = run_summary(Run.open(fake_ranks(tmp_path / "d", hashes)), verify=True)
    assert summary.distributed is not None and summary.distributed["world_size"] == 2
    assert summary.ranks == [
        RankStatus(rank=0, complete=True, last_step=2, steps_logged=2, host=None),
        RankStatus(rank=1, complete=True, last_step=2, steps_logged=2, host=None),
    ]
    assert (
        isinstance(summary.replicas, RankDrift)
        and summary.replicas.step == 2
        and summary.verified == 4
    )
    found = summary.to_json()
    assert list(found) == [*KEYS, "distributed", "ranks", "replicas", "layout"]
    assert found["ranks"][1] == {
        "rank": 1,
        "complete": True,
        "last_step": 2,
        "steps_logged": 2,
        "host": None,
        "node": None,
    }
    assert found["layout"]["missing"] == [] and found["layout"]["partial"] is False
    assert found["replicas"]["tensors"] == [{"tensor": "w", "ranks": [1], "group": [0, 1]}]
    text = rendered(summary)
    assert "2 (ddp, gloo)" in text and "part at step 2" in text and "w on rank 1" in text


def test_the_html_report_reads_the_summary(tmp_path) -> None:
    summary = run_summary(Run.open(one_process(tmp_path / "a")))
    page = summary_html(summary, {0: 2.0, 2: 1.5})
    assert (
        f"bisect-repro show: {tmp_path / 'a'}" in page
        and "lr=0.1" in page
        and "2, at steps 0 to 2" in page
    )
    assert page.rstrip().endswith("bisect-repro/show/1</footer></main></body></html>")
