"""Hugging Face Trainer: a run recorded with the callback, twice, compared and replayed through the
script."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from bisect_repro.store.run import Run

SCRIPT = "hf_train.py"


def test_a_reseed_in_compute_loss_is_found_at_its_step_layer_and_stream(
    train, compare, tmp_path
) -> None:
    train(SCRIPT, "--out", "a")
    train(SCRIPT, "--out", "b", "--reseed-at", "7")
    run = Run.open(tmp_path / "a")
    assert (
        len(run.steps) == 20
        and run.meta.config["args.seed"] == 0
        and run.meta.environment["framework.precision"] == "fp32"
    )
    code, report = compare("a", "b")
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["phase"], verdict["layer"]) == (
        7,
        "forward",
        "transformer.drop",
    )
    assert (
        verdict["cause"] == "rng_state"
        and verdict["rng"] == ["torch"]
        and verdict["confidence"] == "proven"
    )
    assert verdict["reseeded"][0]["where"].endswith("hf_train.py:42")
    # each experiment on step 7 rewinds the run's one replaying process (a dozen when each took a
    # fresh one)
    assert report["replay"]["processes"] == 3 and not any(
        "not by rewinding" in n for n in report["notes"]
    ), report


@pytest.mark.extended
def test_identical_runs_with_gradient_accumulation(train, compare, tmp_path) -> None:
    train(SCRIPT, "--out", "a", "--accumulate", "2", "--steps", "8")
    train(SCRIPT, "--out", "b", "--accumulate", "2", "--steps", "8")
    run = Run.open(tmp_path / "a")
    assert (
        sorted(run.steps) == list(range(8))
        and run.meta.environment["framework.gradient_accumulation_steps"] == 2
    )
    code, report = compare("a", "b")
    assert code == 0 and report["identical"]


def test_a_resume_from_a_trainer_checkpoint_is_exact(train, compare, tmp_path) -> None:
    train(SCRIPT, "--out", "a", "--save-every", "10")
    train(SCRIPT, "--out", "resumed", "--resume", "out/checkpoint-10")
    assert Run.open(tmp_path / "resumed").meta.options.start_step == 10
    code, report = compare("a", "resumed")
    # the Trainer restores the model, optimizer, scheduler, RNG and data position
    assert code == 0 and report["identical"]
    assert [row["step"] for row in report["timeline"]] == [10, 15, 20]
