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
# the reseed before the forward pass
RESEED = f"{RECIPE}:{RECIPE.read_text().splitlines().index('            torch.seed()') + 1}"


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
    assert (verdict["step"], verdict["cause"], verdict["rng"]) == (9, "rng_state", ["torch"]), (
        verdict
    )
    assert (verdict["phase"], verdict["confidence"]) == ("forward", "proven"), verdict
    assert (
        verdict["reseeded"][0]["call"] == "torch.seed()"
        and verdict["reseeded"][0]["where"] == RESEED
    )
    assert RESEED in verdict["fix"]


def test_an_unseeded_generator_held_by_the_dataset_is_named_and_proven(tmp_path: Path) -> None:
    recipe = RECIPE.with_name("augmented.py")
    for name, extra in (("a", []), ("b", ["--set", "seeded=false"])):
        args = [
            "record",
            f"{recipe}:build",
            "--out",
            str(tmp_path / name),
            "--quiet",
            "--steps",
            "10",
            "--every",
            "5",
        ]
        result = runner.invoke(app, [*args, *extra])
        assert result.exit_code == 0, result.output
    assert "loader.dataset.rng" in json.loads((tmp_path / "a" / "run.json").read_text())["streams"]
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["cause"], verdict["confidence"]) == (
        0,
        "data",
        "data_content",
        "proven",
    ), verdict
    assert verdict["rng"] == ["loader.dataset.rng"] and "'loader.dataset.rng'" in verdict["fix"]


def test_a_scheduler_milestone_in_the_config_is_proven_and_the_output_folder_is_not_blamed(
    tmp_path: Path,
) -> None:
    """The checkpoint at step 30 holds the learning rate run B's scheduler has already decayed: the
    config experiment rebuilds run B with run A's milestone from its first checkpoint instead."""
    recipe = RECIPE.with_name("milestones.py")
    for name, extra in (
        ("a", ["--set", "out_dir=runs/a"]),
        ("b", ["--set", "milestone=30", "--set", "out_dir=runs/b"]),
    ):
        args = [
            "record",
            f"{recipe}:build",
            "--out",
            str(tmp_path / name),
            "--quiet",
            "--steps",
            "36",
            "--every",
            "5",
        ]
        result = runner.invoke(app, [*args, "--checkpoint-every", "10", *extra])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["layer"], verdict["op"]) == (
        30,
        "optimizer",
        "0",
        "aten.add_.Tensor",
    ), verdict
    assert (verdict["cause"], verdict["confidence"], verdict["config_keys"]) == (
        "config",
        "proven",
        ["milestone"],
    ), verdict
    assert "out_dir" not in verdict["fix"]
    records_only = json.loads(
        runner.invoke(
            app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--no-replay"]
        ).stdout
    )
    settings = [
        e["detail"]
        for e in records_only["verdict"]["evidence"]
        if e["subject"] == "the snapshots' settings"
    ]
    assert settings == [
        "the non-tensor state differs at step 0: scheduler.milestones ({'40': 1} vs {'30': 1}), "
        "set by the config key milestone"
    ]


def test_doctor_names_the_reseed_behind_a_closure_counter_not_streams_nothing_draws_from() -> None:
    result = runner.invoke(
        app, ["doctor", f"{RECIPE}:build", "--set", "reseed_at=14", "--steps", "16", "--json"]
    )
    assert result.exit_code == 1, result.output
    findings = {f["id"]: f for f in json.loads(result.stdout)["findings"]}
    torch_reseed = findings["reseeded-stream:torch"]
    assert (
        torch_reseed["severity"] == "error"
        and f"torch.seed() at {RESEED}" in torch_reseed["evidence"]
    )
    assert (
        "step 14" in torch_reseed["evidence"]
        and "with that seeding given a fixed seed, the step repeats" in torch_reseed["evidence"]
    )
    errors = [name for name, finding in findings.items() if finding["severity"] == "error"]
    # python and numpy differ, but nothing draws from them
    assert errors == ["reseeded-stream:torch"], findings


def test_a_reseed_after_the_update_names_its_call_though_the_next_snapshots_tensors_are_equal(
    tmp_path: Path,
) -> None:
    """Reseeded at the end of step 3: the snapshot of step 4 has equal tensors and the stream in
    another state. The swap proves the stream; the call is found from the last snapshot where the
    stream was equal (step 2), not the last with equal tensors (step 4)."""
    common = [
        "--quiet",
        "--steps",
        "6",
        "--every",
        "2",
        "--checkpoint-every",
        "2",
        "--set",
        "reseed_at=3",
        "--set",
        "after_update=true",
    ]
    for name in ("a", "b"):
        result = runner.invoke(
            app, ["record", f"{RECIPE}:build", "--out", str(tmp_path / name), *common]
        )
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    verdict = report["verdict"]
    # the premise: the tensors still equal at step 4
    assert report["snapshots"]["last_equal"] == 4, report["snapshots"]
    assert (verdict["step"], verdict["cause"], verdict["rng"], verdict["confidence"]) == (
        4,
        "rng_state",
        ["torch"],
        "proven",
    ), verdict
    assert [call["call"] for call in verdict["reseeded"]] == ["torch.seed()"], verdict
    assert verdict["reseeded"][0]["where"].startswith(str(RECIPE)), verdict
