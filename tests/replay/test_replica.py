"""A replica: a recorded run relaunched in its own process, replaying its records exactly."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from bisect_repro.capture.trace import first_difference
from bisect_repro.cli import app
from bisect_repro.replay.launch import ReplayUnavailable, spec_for_run
from bisect_repro.replay.replica import Replica, ReplicaFailed
from bisect_repro.store.run import Run


def recorded(examples, tmp_path, name: str = "mlp.py", *args: str) -> Run:
    out = tmp_path / "r"
    result = CliRunner().invoke(
        app, ["record", f"{examples / name}:build", "--out", str(out), "--quiet", *args]
    )
    assert result.exit_code == 0, result.output
    return Run.open(out)


def test_a_replica_reproduces_its_records_step_by_step(examples, tmp_path) -> None:
    run = recorded(
        examples, tmp_path, "mlp.py", "--steps", "10", "--every", "5", "--set", "num_workers=2"
    )
    with Replica(spec_for_run(run), "A") as replica:
        replica.connect()
        replica.restore(run.path, 0, run.meta.environment)
        skipped = replica.skip(10, hashes_at=[5, 10])
        assert skipped.step == 10
        assert [(r.order, r.batch, r.loss) for r in skipped.records] == [
            (run.steps[s]["order"], run.steps[s]["batch"], run.steps[s]["loss"]) for s in range(10)
        ]
        assert skipped.hashes == {5: run.snapshot(5)["hashes"], 10: run.snapshot(10)["hashes"]}


def test_a_kept_step_runs_again_from_its_start(examples, tmp_path) -> None:
    run = recorded(examples, tmp_path, "cnn.py", "--steps", "2", "--every", "1")
    with Replica(spec_for_run(run), "A") as replica:
        replica.connect()
        replica.restore(run.path, 0, run.meta.environment)
        fetched = replica.fetch()
        assert (fetched.order, fetched.batch) == (run.steps[0]["order"], run.steps[0]["batch"])
        light = replica.run(0, trace="light", commit=True)
        assert light.loss == run.steps[0]["loss"] and replica.hashes() == run.snapshot(1)["hashes"]
        again, full = replica.run(0, trace="light"), replica.run(0, trace="full", keep=[3])
        assert (
            first_difference(light.entries, again.entries) is None
            and light.outcome == again.outcome
        )
        # forward and backward too, and a copy on request
        assert len(full.entries) > len(light.entries) and 3 in full.kept
        assert full.streams_after == light.streams_after and not full.seeding


def test_the_recorded_environment_variables_are_set_or_unset_as_they_were(
    examples, tmp_path, monkeypatch
) -> None:
    run = recorded(examples, tmp_path, "mlp.py", "--steps", "2", "--every", "1")
    # not set when the run was recorded: the replay must unset it
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    spec = spec_for_run(run)
    assert "OMP_NUM_THREADS" in spec.variables and spec.variables["OMP_NUM_THREADS"] is None
    with Replica(
        spec.with_variables(
            {**spec.variables, "OMP_NUM_THREADS": None, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        ),
        "A",
    ) as replica:
        replica.connect()
        environment = replica.describe().environment
    assert (
        environment["env.OMP_NUM_THREADS"] is None
        and environment["env.CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    )
    assert os.environ["OMP_NUM_THREADS"] == "7"


def test_a_recipe_that_is_gone_or_fails_is_one_line(examples, tmp_path) -> None:
    recipe = tmp_path / "gone.py"
    recipe.write_text((examples / "mlp.py").read_text())
    out = tmp_path / "r"
    assert (
        CliRunner()
        .invoke(app, ["record", f"{recipe}:build", "--out", str(out), "--quiet", "--steps", "2"])
        .exit_code
        == 0
    )
    recipe.write_text("raise RuntimeError('the data is gone')\n")
    with pytest.raises(ReplayUnavailable, match="changed since the run was recorded"):
        spec_for_run(Run.open(out))
    with (
        Replica(spec_for_run(Run.open(out), accept_changed=True), "A") as replica,
        pytest.raises(ReplicaFailed, match="the data is gone"),
    ):
        replica.connect()
    recipe.unlink()
    with pytest.raises(ReplayUnavailable, match="not on this machine"):
        spec_for_run(Run.open(out), accept_changed=True)
