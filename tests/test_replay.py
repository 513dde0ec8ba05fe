from __future__ import annotations

from typer.testing import CliRunner

from bisect_repro.cli import app
from bisect_repro.replay import Replica
from bisect_repro.store import Run
from bisect_repro.trace import first_difference


def test_a_replica_replays_its_run_faithfully(examples, tmp_path) -> None:
    out = tmp_path / "r"
    result = CliRunner().invoke(
        app, ["record", f"{examples / 'mlp.py'}:build", "--out", str(out), "--steps", "10", "--every", "5", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    run = Run.open(out)
    replica = Replica(run, "A")
    replica.restore(0)
    for _ in range(10):
        replica.advance(replica.fetch())
        if replica.step in run.snapshots:
            assert replica.faithful_at(replica.step), replica.step
    replica.close()


def test_two_replicas_interleaved_do_not_disturb_each_other(examples, tmp_path) -> None:
    out = tmp_path / "r"
    CliRunner().invoke(app, ["record", f"{examples / 'mlp.py'}:build", "--out", str(out), "--steps", "6", "--every", "3", "--quiet"])
    run = Run.open(out)
    a, b = Replica(run, "A"), Replica(run, "B")
    a.restore(0)
    b.restore(0)
    for _ in range(6):  # dropout draws from the global torch stream: each replica must keep its own
        trace_a = a.advance(a.fetch())
        trace_b = b.advance(b.fetch())
        assert first_difference(trace_a.entries, trace_b.entries) is None
    assert a.faithful_at(6) and b.faithful_at(6)


def test_a_step_reruns_from_its_start_identically(examples, tmp_path) -> None:
    out = tmp_path / "r"
    CliRunner().invoke(app, ["record", f"{examples / 'cnn.py'}:build", "--out", str(out), "--steps", "2", "--every", "1", "--quiet"])
    replica = Replica(Run.open(out), "A")
    replica.restore(0)
    start = replica.fetch()
    first = replica.advance(start)
    again = replica.run_step(start, full=False)
    assert len(replica.run_step(start).entries) > len(again.entries)  # the full trace has forward and backward too
    assert first_difference(first.entries, again.entries) is None
    replica.close()
