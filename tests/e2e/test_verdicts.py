"""Verdicts on recipes the examples do not cover, end to end through the CLI: each asserts the step,
the phase, the layer, the cause, the confidence and the evidence behind it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()
RECIPES = Path(__file__).resolve().parent / "recipes"
RESEED_LINE = next(  # the line of transformer.py's torch.seed()
    n
    for n, line in enumerate((RECIPES / "transformer.py").read_text().splitlines(), 1)
    if line.strip() == "torch.seed()"
)


def record(target: str, out: Path, *args: str) -> Path:
    result = runner.invoke(app, ["record", target, "--out", str(out), "--quiet", *args])
    assert result.exit_code == 0, result.output
    return out


def compare(a: Path, b: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["compare", str(a), str(b), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "bisect-repro/compare/2"
    return result.exit_code, report


def pair(
    tmp_path: Path, recipe: str, *args: str, b_args: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    target = f"{RECIPES / recipe}:build"
    return record(target, tmp_path / "a", *args), record(target, tmp_path / "b", *args, *b_args)


def experiments(verdict: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for item in verdict["evidence"]:
        found.setdefault(item["experiment"], []).append(item["outcome"])
    return found


@pytest.mark.extended
def test_a_reseed_from_entropy_mid_run_is_found_at_its_step_with_its_call_site(tmp_path) -> None:
    a, b = pair(
        tmp_path, "transformer.py", "--steps", "20", "--every", "10", "--set", "reseed_at=14"
    )
    code, report = compare(a, b)
    verdict = report["verdict"]
    assert code == 1
    assert (verdict["step"], verdict["phase"], verdict["layer"]) == (
        14,
        "forward",
        "encoder.layers.0.self_attn",
    )
    assert (
        verdict["cause"] == "rng_state"
        and verdict["confidence"] == "proven"
        and verdict["rng"] == ["torch"]
    )
    # the dropout mask, not an op fed uninitialised memory
    assert verdict["op"] == "aten.bernoulli_.float"
    [call] = verdict["reseeded"]
    assert (
        call["call"] == "torch.seed()"
        and call["where"] == f"{RECIPES / 'transformer.py'}:{RESEED_LINE}"
    )
    assert (
        experiments(verdict)["self_rerun"] == ["differs", "differs"]
        and experiments(verdict)["reseed_fixed"] == ["matches"] * 2
    )
    assert (
        f"transformer.py:{RESEED_LINE}" in verdict["fix"]
        and "torch.manual_seed(seed)" in verdict["fix"]
    )
    assert report["replay"]["faithful"] and report["replay"]["from_step"] == 0


@pytest.mark.extended
def test_a_reseed_at_the_end_of_a_step_is_named_from_the_step_log_where_the_next_step_parts(
    tmp_path,
) -> None:
    a, b = pair(
        tmp_path, "transformer.py", "--steps", "8", "--every", "2", "--set", "reseed_after=4"
    )
    code, report = compare(a, b)
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["phase"], verdict["op"]) == (
        5,
        "forward",
        "aten.bernoulli_.float",
    ), verdict
    assert (verdict["cause"], verdict["confidence"], verdict["rng"]) == (
        "rng_state",
        "proven",
        ["torch"],
    ), verdict
    # the proof: run B with run A's torch stream matches
    assert experiments(verdict)["stream"] == ["matches"]
    [call] = verdict["reseeded"]  # and how the streams came apart, from the step logs
    assert (
        call["call"] == "torch.seed()"
        and call["where"] == f"{RECIPES / 'transformer.py'}:{RESEED_LINE}"
    )
    assert "reseeded from entropy before this step (torch.seed() at " in verdict["explanation"]
    assert (
        "remove the reseeding from entropy (torch.seed() at " in verdict["fix"]
        and f"transformer.py:{RESEED_LINE}" in verdict["fix"]
    )


def test_a_late_draw_from_an_unseeded_stream_behind_a_step_counter(tmp_path) -> None:
    a, b = pair(tmp_path, "mixup.py", "--steps", "20", "--every", "10")
    code, report = compare(a, b)
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["phase"], verdict["layer"]) == (
        12,
        "forward",
        "0",
    )
    assert (
        verdict["cause"] == "rng_state"
        and verdict["rng"] == ["numpy"]
        and verdict["confidence"] == "proven"
    )
    assert experiments(verdict)["self_rerun"] == ["matches", "matches"]
    # then stream by stream when several differ
    assert experiments(verdict)["stream"] == ["matches"]
    assert "np.random.seed(seed)" in verdict["fix"]


@pytest.mark.extended
def test_a_late_divergence_with_the_checkpoint_far_before_it_and_a_counter_the_checkpoint_lacks(
    tmp_path,
) -> None:
    args = ("--steps", "100", "--every", "20", "--checkpoint-every", "40", "--set", "mixup_from=73")
    a, b = pair(tmp_path, "mixup.py", *args)
    code, report = compare(a, b)
    verdict = report["verdict"]
    assert code == 1 and report["snapshots"] == {"last_equal": 60, "first_divergent": 80}
    assert (verdict["step"], verdict["phase"], verdict["cause"], verdict["confidence"]) == (
        73,
        "forward",
        "rng_state",
        "proven",
    )
    assert verdict["rng"] == ["numpy"]
    # From the checkpoint at 40 the object's counter restarts at 0: the replay parts from the
    # records, says so, and replays again in fresh processes from step 0, where the counter does
    # start.
    assert any(
        "parted from the records" in note and "steps 40/40" in note for note in report["notes"]
    )
    assert report["replay"]["from_step"] == 0 and report["replay"]["faithful"]


def test_a_counter_that_no_checkpoint_holds_is_named_when_no_earlier_checkpoint_helps(
    tmp_path,
) -> None:
    target = f"{RECIPES / 'mixup.py'}:build"
    args = ("--steps", "40", "--every", "10", "--checkpoint-every", "20", "--set", "mixup_from=33")
    a, b = record(target, tmp_path / "a", *args), record(target, tmp_path / "b", *args)
    # drop the checkpoint at step 0: only the one at 20, where the counter restarts, is left
    for run in (a, b):
        index = run / "rank0" / "index.jsonl"
        lines = [
            line
            for line in index.read_text().splitlines()
            if '"checkpoint", "step": 0' not in line.replace("'", '"')
        ]
        kept = [
            line
            for line in lines
            if not (json.loads(line).get("kind") == "checkpoint" and json.loads(line)["step"] == 0)
        ]
        index.write_text("\n".join(kept) + "\n")
    code, report = compare(a, b)
    verdict = report["verdict"]
    assert code == 1 and verdict["cause"] == "hidden_state" and verdict["confidence"] == "proven"
    assert not report["replay"]["faithful"] and {p["run"] for p in report["replay"]["parted"]} == {
        "A",
        "B",
    }
    replays = [item for item in verdict["evidence"] if item["experiment"] == "replay"]
    assert any(
        item["outcome"] == "differs" and "depends on how often the code ran" in item["detail"]
        for item in replays
    )
    assert "Trainee(state=" in verdict["fix"] and "current_step()" in verdict["fix"]


def test_a_config_key_that_changes_the_data_content_is_proven_by_rebuilding(tmp_path) -> None:
    a, b = pair(
        tmp_path, "noisy_data.py", "--steps", "6", "--every", "3", b_args=("--set", "num_workers=2")
    )
    code, report = compare(a, b)
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["phase"], verdict["tensor"]) == (
        0,
        "data",
        "batch[0]",
    )
    assert (
        verdict["cause"] == "config"
        and verdict["config_keys"] == ["num_workers"]
        and verdict["confidence"] == "proven"
    )
    assert experiments(verdict)["config"] == ["matches"]
    assert "num_workers" in verdict["fix"] and "seed the streams" not in verdict["fix"]


@pytest.mark.extended
@pytest.mark.slow
def test_a_compiled_model_is_identical_and_doctor_finds_nothing_wrong(tmp_path) -> None:
    a, b = pair(tmp_path, "compiled.py", "--steps", "6", "--every", "3")
    assert compare(a, b)[0] == 0
    result = runner.invoke(app, ["doctor", f"{RECIPES / 'compiled.py'}:build", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["reproducible"], report["findings"]
    assert not [f for f in report["findings"] if f["severity"] == "error"]


@pytest.mark.extended
def test_doctor_names_a_step_that_counts_its_own_calls_and_the_stream_it_draws_late(
    tmp_path,
) -> None:
    result = runner.invoke(
        app, ["doctor", f"{RECIPES / 'mixup.py'}:build", "--steps", "14", "--json"]
    )
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    ids = {f["id"]: f for f in report["findings"]}
    assert (
        ids["hidden-state"]["severity"] == "error"
        and "once it has run" in ids["hidden-state"]["evidence"]
    )
    assert (
        ids["unseeded-stream:numpy"]["severity"] == "error"
        and "draws from it" in ids["unseeded-stream:numpy"]["evidence"]
    )
    assert "nondeterministic-op" not in ids


@pytest.mark.extended
def test_doctor_names_a_reseed_with_its_call_site(tmp_path) -> None:
    result = runner.invoke(
        app,
        [
            "doctor",
            f"{RECIPES / 'transformer.py'}:build",
            "--steps",
            "3",
            "--set",
            "reseed_at=1",
            "--json",
        ],
    )
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    finding = next(f for f in report["findings"] if f["id"] == "reseeded-stream:torch")
    assert (
        finding["severity"] == "error"
        and f"transformer.py:{RESEED_LINE}" in finding["evidence"]
        and "step 1" in finding["evidence"]
    )
    assert "nondeterministic-op" not in {f["id"] for f in report["findings"]}
