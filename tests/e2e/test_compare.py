"""Two runs recorded, then compared, end to end through the CLI: one test per scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bisect_repro import Recorder, RecordOptions
from bisect_repro.cli import app
from bisect_repro.record.recipe import build

runner = CliRunner()


def record(target: str, out: Path, *args: str) -> None:
    result = runner.invoke(app, ["record", target, "--out", str(out), "--quiet", *args])
    assert result.exit_code == 0, result.output


def compare(a: Path, b: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["compare", str(a), str(b), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def record_pair(tmp_path: Path, target: str, *args: str) -> tuple[Path, Path]:
    record(target, tmp_path / "a", *args)
    record(target, tmp_path / "b", *args)
    return tmp_path / "a", tmp_path / "b"


def assert_verdict(verdict: dict, **expected: object) -> None:
    for key, value in expected.items():
        assert verdict[key] == value, f"{key}: {verdict[key]!r} != {value!r} in {verdict}"


def test_model_initialised_without_a_seed(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path, f"{examples / 'unseeded_init.py'}:build", "--steps", "6", "--every", "3"
    )
    code, result = compare(a, b)
    assert code == 1
    assert_verdict(
        result["verdict"], step=0, phase="init", layer="0", tensor="0.weight", cause="rng_state"
    )
    assert result["verdict"]["rng"] == ["torch"] and "torch.manual_seed" in result["verdict"]["fix"]
    assert result["verdict"]["fraction_differing"] == 1.0


def test_shuffle_without_a_seeded_generator(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path, f"{examples / 'unseeded_shuffle.py'}:build", "--steps", "6", "--every", "3"
    )
    code, result = compare(a, b)
    assert code == 1
    assert_verdict(result["verdict"], step=0, phase="data", cause="data_order")
    assert "generator=torch.Generator().manual_seed(seed)" in result["verdict"]["fix"]
    fixed = tmp_path / "fixed"
    a, b = record_pair(
        fixed,
        f"{examples / 'unseeded_shuffle.py'}:build",
        "--steps",
        "6",
        "--every",
        "3",
        "--set",
        "seeded_loader=true",
    )
    assert compare(a, b)[0] == 0  # the fix the verdict names makes the runs identical


def test_table_lookup_backward_on_two_threads_is_a_nondeterministic_op(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path,
        f"{examples / 'lookup.py'}:build",
        "--steps",
        "10",
        "--every",
        "5",
        "--checkpoint-every",
        "5",
    )
    code, result = compare(a, b)
    assert code == 1
    verdict = result["verdict"]
    assert_verdict(
        verdict,
        phase="backward",
        layer="embed",
        tensor="embed.table.grad",
        cause="nondeterministic_op",
    )
    assert verdict["op"] is not None and "index_put" in verdict["op"]
    assert (
        0 < verdict["fraction_differing"] < 1
        and verdict["max_ulp"] >= 1
        and verdict["max_abs_diff"] > 0
    )
    assert "torch.use_deterministic_algorithms(True)" in verdict["fix"]
    replay = result["replay"]
    assert (
        replay["performed"]
        and replay["replayed_steps"] <= verdict["step"] - replay["from_step"] + 1
    )


def test_deterministic_algorithms_fix_the_lookup(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path,
        f"{examples / 'lookup.py'}:build",
        "--steps",
        "6",
        "--every",
        "3",
        "--set",
        "deterministic=true",
    )
    assert compare(a, b)[0] == 0


@pytest.mark.extended  # a thread count case: tests/e2e/test_numerics.py's run in every suite
def test_thread_count_changes_a_reduction(examples, tmp_path) -> None:
    target = f"{examples / 'threads.py'}:build"
    for name, threads in (("a", "1"), ("b", "2")):
        environment = {**os.environ, "OMP_NUM_THREADS": threads}
        command = [
            sys.executable,
            "-m",
            "bisect_repro.cli",
            "record",
            target,
            "--out",
            str(tmp_path / name),
            "--steps",
            "4",
            "--every",
            "2",
            "--quiet",
        ]
        subprocess.run(command, env=environment, check=True, capture_output=True)
    code, result = compare(tmp_path / "a", tmp_path / "b")
    assert code == 1
    assert_verdict(
        result["verdict"],
        step=0,
        phase="forward",
        layer="0",
        op="aten.mean.default",
        cause="environment",
    )
    assert result["environment_diff"]["torch.get_num_threads"] == [1, 2]
    assert "torch.set_num_threads" in result["verdict"]["fix"]


def test_resume_that_does_not_restore_the_streams_diverges_at_the_resume_step(
    examples, tmp_path
) -> None:
    target = f"{examples / 'mlp.py'}:build"
    record(target, tmp_path / "whole", "--steps", "20", "--every", "5", "--checkpoint-every", "10")
    trainee = build(target, {"seed": 3})
    resumed = tmp_path / "resumed"
    options = RecordOptions(steps=20, every=5, checkpoint_every=10)
    with Recorder(
        resumed,
        trainee,
        options,
        target=target,
        resume_from=(tmp_path / "whole", 10),
        restore_streams=False,
    ) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    code, result = compare(tmp_path / "whole", resumed)
    assert code == 1
    assert_verdict(result["verdict"], step=10, phase="forward", layer="2", cause="rng_state")
    assert (
        "torch" in result["verdict"]["rng"]
        and "restore every random stream" in result["verdict"]["fix"]
    )


def test_divergence_between_two_snapshots_is_found_at_its_step(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path,
        f"{examples / 'late_noise.py'}:build",
        "--steps",
        "50",
        "--every",
        "10",
        "--checkpoint-every",
        "10",
    )
    code, result = compare(a, b)
    assert code == 1
    assert result["snapshots"] == {"last_equal": 30, "first_divergent": 40}
    assert_verdict(
        result["verdict"],
        step=37,
        phase="forward",
        layer="2",
        tensor="2.output",
        cause="rng_state",
        rng=["python"],
    )
    assert result["verdict"]["op"] == "aten.mul.Tensor"
    assert result["replay"] == {
        **result["replay"],
        "from_step": 30,
        "replayed_steps": 8,
        "faithful": True,
    }


def test_identical_seeded_runs_with_workers_dropout_and_adam(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path,
        f"{examples / 'mlp.py'}:build",
        "--steps",
        "40",
        "--every",
        "10",
        "--set",
        "num_workers=2",
    )
    code, result = compare(a, b)
    assert code == 0 and result["identical"] and result["verdict"] is None
    human = runner.invoke(app, ["compare", str(a), str(b)])
    assert human.exit_code == 0 and "identical" in human.stdout


def test_different_config_and_structure(examples, tmp_path) -> None:
    target = f"{examples / 'mlp.py'}:build"
    record(target, tmp_path / "a", "--steps", "4", "--every", "2")
    record(target, tmp_path / "lr", "--steps", "4", "--every", "2", "--set", "lr=0.01")
    code, result = compare(tmp_path / "a", tmp_path / "lr")
    assert code == 1 and result["config_diff"] == {"lr": [None, 0.01]}
    assert_verdict(result["verdict"], step=0, phase="optimizer", cause="config")
    record(target, tmp_path / "wide", "--steps", "4", "--every", "2", "--set", "hidden=32")
    code, result = compare(tmp_path / "a", tmp_path / "wide")
    assert code == 1
    assert_verdict(
        result["verdict"], step=0, phase="init", layer="0", tensor="0.weight", cause="structure"
    )


def test_no_replay_compares_records_only(examples, tmp_path) -> None:
    a, b = record_pair(
        tmp_path, f"{examples / 'unseeded_shuffle.py'}:build", "--steps", "6", "--every", "3"
    )
    code, result = compare(a, b, "--no-replay")
    assert code == 1 and not result["replay"]["performed"]
    assert_verdict(result["verdict"], step=0, phase="data", cause="data_order")


def test_human_report_leads_with_the_verdict_and_names_the_fix(examples, tmp_path) -> None:
    result = runner.invoke(app, ["demo", "--out", str(tmp_path), "--steps", "10"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.index("verdict") < text.index("snapshot timeline")
    assert "nondeterministic op" in text and "embed.table.grad" in text and "Fix:" in text
    assert "use_deterministic_algorithms" in text
    # The envelope of a run that differs from itself is that run again, nothing changed.
    assert (
        "envelope measured by replaying run A from step 0 with nothing changed (run A differs from "
        "itself: aten.index_put" in " ".join(text.split())
    )


def test_a_recipe_missing_here_falls_back_to_the_records(examples, tmp_path) -> None:
    recipe = tmp_path / "gone.py"
    recipe.write_text((examples / "unseeded_shuffle.py").read_text())
    a, b = record_pair(tmp_path, f"{recipe}:build", "--steps", "4", "--every", "2")
    recipe.unlink()
    code, result = compare(a, b)
    assert code == 1 and not result["replay"]["performed"]
    assert any("not on this machine" in note for note in result["notes"])
    assert_verdict(result["verdict"], step=0, phase="data", cause="data_order")


def test_compare_errors_are_one_line(tmp_path) -> None:
    result = runner.invoke(app, ["compare", str(tmp_path / "x"), str(tmp_path / "y")])
    assert (
        result.exit_code == 2
        and "no such run" in result.stderr
        and "Traceback" not in result.output
    )


@pytest.fixture(autouse=True)
def _restore_threads():
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def test_replay_skips_to_the_last_equal_snapshot(examples, tmp_path) -> None:
    args = ("--steps", "20", "--every", "10", "--checkpoint-every", "20", "--set", "warmup=12")
    a, b = record_pair(tmp_path, f"{examples / 'late_noise.py'}:build", *args)
    code, result = compare(a, b)
    assert (
        code == 1 and result["snapshots"]["last_equal"] == 10 and result["replay"]["from_step"] == 0
    )
    assert_verdict(
        result["verdict"], step=12, phase="forward", cause="rng_state", confidence="proven"
    )
    assert result["replay"]["faithful"] and result["replay"]["replayed_steps"] == 13
    # the scalar drawn from random
    assert any("other Python arguments" in note for note in result["notes"])
