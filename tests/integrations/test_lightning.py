"""Lightning: a run recorded with the callback, twice, compared and replayed through the script."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lightning")

from bisect_repro.store.run import Run

SCRIPT = "lightning_train.py"


def test_a_reseed_in_training_step_is_found_at_its_step_layer_and_stream(
    train, compare, tmp_path
) -> None:
    train(SCRIPT, "--out", "a")
    train(SCRIPT, "--out", "b", "--reseed-at", "7")
    run = Run.open(tmp_path / "a")
    assert len(run.steps) == 20 and run.meta.options.replay == "from_start"
    assert (
        run.meta.config["lr"] == 0.01 and run.meta.environment["framework.precision"] == "32-true"
    )
    code, report = compare("a", "b")
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["phase"], verdict["layer"]) == (
        7,
        "forward",
        "net.2",
    )
    assert (
        verdict["cause"] == "rng_state"
        and verdict["rng"] == ["torch"]
        and verdict["confidence"] == "proven"
    )
    assert (
        verdict["op"] == "aten.bernoulli_.float"
        and verdict["reseeded"][0]["call"] == "torch.seed()"
    )
    # each experiment on step 7 rewinds the run's one replaying process (a dozen when each took a
    # fresh one)
    assert report["replay"]["processes"] == 3 and not any(
        "not by rewinding" in n for n in report["notes"]
    ), report


@pytest.mark.extended
def test_identical_runs_with_gradient_accumulation(train, compare, tmp_path) -> None:
    train(SCRIPT, "--out", "a", "--accumulate", "2", "--steps", "10")
    train(SCRIPT, "--out", "b", "--accumulate", "2", "--steps", "10")
    run = Run.open(tmp_path / "a")
    assert sorted(run.steps) == list(range(10))  # one step per optimizer update, two batches each
    assert run.meta.environment["framework.accumulate_grad_batches"] == 2
    code, report = compare("a", "b")
    assert code == 0 and report["identical"]


def test_a_resume_from_a_lightning_checkpoint_against_the_uninterrupted_run(
    train, compare, tmp_path
) -> None:
    train(SCRIPT, "--out", "a")
    train(SCRIPT, "--out", "first", "--steps", "10", "--save", "ckpt.ckpt")
    train(SCRIPT, "--out", "resumed", "--resume", "ckpt.ckpt")
    assert (
        json.loads((tmp_path / "resumed" / "run.json").read_text())["options"]["start_step"] == 10
    )
    code, report = compare("a", "resumed")
    verdict = report["verdict"]
    # Lightning restores the model, the optimizer and the loop, not the shuffle of a plain
    # DataLoader mid-epoch: the first step after the resume trains on other samples, drawn from a
    # torch stream in another state (the command lines differ by --resume too, which is how a resume
    # is asked for, not the cause).
    assert code == 1 and (verdict["step"], verdict["phase"]) == (10, "data")
    assert (
        verdict["cause"] == "rng_state"
        and verdict["rng"] == ["torch"]
        and verdict["confidence"] == "inferred"
    )
    assert (
        "resumed at step 10" in verdict["explanation"]
        and "restore the data position" in verdict["fix"]
    )
    assert report["snapshots"]["last_equal"] == 10  # the model and optimizer were restored exactly


@pytest.mark.extended
@pytest.mark.slow
def test_a_training_step_reading_its_batch_idx_is_caught_when_rewound_and_run_afresh(
    train, compare, tmp_path
) -> None:
    train(SCRIPT, "--out", "a", "--steps", "8", "--weigh-by-batch-idx")
    train(SCRIPT, "--out", "b", "--steps", "8", "--weigh-by-batch-idx", "--reseed-at", "3")
    code, report = compare("a", "b")
    verdict = report["verdict"]
    assert code == 1 and (
        verdict["step"],
        verdict["layer"],
        verdict["cause"],
        verdict["confidence"],
    ) == (3, "net.2", "rng_state", "proven")
    notes = [note for note in report["notes"] if "not by rewinding" in note]
    # the loop hands the rewound step the next batch's index, a local of its own the rewind cannot
    # put back
    assert (
        len(notes) == 2
        and "run A's step 3 is repeated in fresh processes" in notes[0]
        and "traced other tensors" in notes[0]
    )
    assert report["replay"]["processes"] > 3
