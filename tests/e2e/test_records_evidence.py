"""Real recipes keep state outside the model: a counter in the step's closure, a generator in the
dataset. Both are recorded, so the verdict is exact and proven (the records' own evidence, when a
replay cannot prove a cause, is tested with a loop's ``enumerate`` counter in ``test_counters``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()
RECIPE = Path(__file__).resolve().parent / "recipes" / "counter_reseed.py"


def test_a_reseed_behind_a_recipes_closure_counter_is_proven(tmp_path: Path) -> None:
    """The counter lives in the step function's closure, which checkpoints hold: the replay from
    the checkpoint at step 5 reproduces the reseed at step 9, and fixing entropy proves it."""
    for name, extra in (("a", []), ("b", ["--set", "reseed_at=9"])):
        args = [
            "record",
            f"{RECIPE}:build",
            "--out",
            str(tmp_path / name),
            "--quiet",
            "--steps",
            "14",
            "--every",
            "5",
            "--checkpoint-every",
            "5",
        ]
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["step"], verdict["cause"], verdict["rng"]) == (9, "rng_state", ["torch"]), verdict
    assert (verdict["phase"], verdict["confidence"]) == ("forward", "proven"), verdict
    assert verdict["reseeded"][0]["call"] == "torch.seed()" and verdict["reseeded"][0]["where"] == f"{RECIPE}:24"
    assert f"{RECIPE}:24" in verdict["fix"]


def test_an_unseeded_generator_held_by_the_dataset_is_named_and_proven(tmp_path: Path) -> None:
    recipe = RECIPE.with_name("augmented.py")
    for name, extra in (("a", []), ("b", ["--set", "seeded=false"])):
        args = ["record", f"{recipe}:build", "--out", str(tmp_path / name), "--quiet", "--steps", "10", "--every", "5"]
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
    assert "loader.dataset.rng" in json.loads((tmp_path / "a" / "run.json").read_text())["streams"]
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["cause"], verdict["confidence"]) == (0, "data", "data_content", "proven"), verdict
    assert verdict["rng"] == ["loader.dataset.rng"] and "'loader.dataset.rng'" in verdict["fix"]


def test_a_scheduler_milestone_in_the_config_is_proven_and_the_output_folder_is_not_blamed(tmp_path: Path) -> None:
    """The checkpoint at step 30 holds the learning rate run B's scheduler has already decayed: the
    config experiment rebuilds run B with run A's milestone from its first checkpoint instead."""
    recipe = RECIPE.with_name("milestones.py")
    for name, extra in (("a", ["--set", "out_dir=runs/a"]), ("b", ["--set", "milestone=30", "--set", "out_dir=runs/b"])):
        args = ["record", f"{recipe}:build", "--out", str(tmp_path / name), "--quiet", "--steps", "36", "--every", "5"]
        result = runner.invoke(app, [*args, "--checkpoint-every", "10", *extra])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["layer"], verdict["op"]) == (30, "optimizer", "0", "aten.add_.Tensor"), verdict
    assert (verdict["cause"], verdict["confidence"], verdict["config_keys"]) == ("config", "proven", ["milestone"]), verdict
    assert "out_dir" not in verdict["fix"]
    records_only = json.loads(runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--no-replay"]).stdout)
    settings = [e["detail"] for e in records_only["verdict"]["evidence"] if e["subject"] == "the snapshots' settings"]
    assert settings == [
        "the non-tensor state differs at step 0: scheduler.milestones ({'40': 1} vs {'30': 1}), set by the config key milestone"
    ]


def test_doctor_names_the_reseed_behind_a_closure_counter_not_streams_nothing_draws_from() -> None:
    result = runner.invoke(app, ["doctor", f"{RECIPE}:build", "--set", "reseed_at=14", "--steps", "16", "--json"])
    assert result.exit_code == 1, result.output
    findings = {f["id"]: f for f in json.loads(result.stdout)["findings"]}
    torch_reseed = findings["reseeded-stream:torch"]
    assert torch_reseed["severity"] == "error" and f"torch.seed() at {RECIPE}:24" in torch_reseed["evidence"]
    assert "step 14" in torch_reseed["evidence"] and "with that seeding given a fixed seed, the step repeats" in torch_reseed["evidence"]
    errors = [name for name, finding in findings.items() if finding["severity"] == "error"]
    assert errors == ["reseeded-stream:torch"], findings  # python and numpy differ, but nothing draws from them
