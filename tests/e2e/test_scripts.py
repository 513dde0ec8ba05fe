"""Scripts with their own training loop, recorded with the Recorder API and run as ``python
script.py``, then compared: compare relaunches each script, unchanged, to replay it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "own_loop.py"


def run_script(script: Path, *args: str, cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]


def compare(a: Path, b: Path, *args: str, cwd: Path) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, "-m", "bisect_repro.cli", "compare", str(a), str(b), "--json", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout), done.stderr


@pytest.fixture
def copy_of_script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.read_text())
    return script


@pytest.fixture(scope="module")
def reseeded_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the script run twice, the second time reseeding torch at step 9: its folder and the
    copy."""
    folder = tmp_path_factory.mktemp("reseeded")
    script = folder / "train.py"
    script.write_text(SCRIPT.read_text())
    run_script(script, "--out", "a", cwd=folder)
    run_script(script, "--out", "b", "--reseed-at", "9", cwd=folder)
    return folder, script


def test_a_reseed_in_the_loop_is_localized_and_proven(reseeded_pair: tuple[Path, Path]) -> None:
    tmp_path, copy_of_script = reseeded_pair
    copy_of_script.write_text(SCRIPT.read_text())
    code, report, stderr = compare(tmp_path / "a", tmp_path / "b", cwd=tmp_path)
    verdict = report["verdict"]
    assert code == 1
    assert (verdict["step"], verdict["phase"], verdict["layer"], verdict["op"]) == (
        9,
        "forward",
        "body.2",
        "aten.bernoulli_.float",
    )
    assert (
        verdict["cause"] == "rng_state"
        and verdict["rng"] == ["torch"]
        and verdict["confidence"] == "proven"
    )
    assert verdict["reseeded"][0]["where"].startswith(f"{copy_of_script}:")
    # what runs is announced before it runs
    assert f"replaying run B by running: python {copy_of_script} --out b --reseed-at 9" in " ".join(
        stderr.split()
    )
    assert report["replay"]["commands"][0].startswith(f"python {copy_of_script} --out a")


@pytest.mark.extended
def test_a_nondeterministic_op_in_the_backward_pass_is_named(
    copy_of_script: Path, tmp_path: Path
) -> None:
    for name in "ab":
        run_script(
            copy_of_script,
            "--out",
            name,
            "--nondeterministic",
            "--steps",
            "6",
            "--every",
            "3",
            cwd=tmp_path,
        )
    code, report, _ = compare(tmp_path / "a", tmp_path / "b", cwd=tmp_path)
    verdict = report["verdict"]
    assert code == 1 and verdict["phase"] == "backward" and verdict["tensor"] == "table.grad", (
        verdict,
        report["notes"],
    )
    assert (
        verdict["cause"] == "nondeterministic_op"
        and verdict["confidence"] == "proven"
        and "index_put" in verdict["op"]
    )
    assert "torch.use_deterministic_algorithms(True)" in verdict["fix"]


def test_an_unseeded_shuffle_is_the_data_order_proven_by_the_loader_streams(
    copy_of_script: Path, tmp_path: Path
) -> None:
    for name in "ab":
        run_script(
            copy_of_script,
            "--out",
            name,
            "--unseeded-shuffle",
            "--steps",
            "4",
            "--every",
            "2",
            cwd=tmp_path,
        )
    code, report, _ = compare(tmp_path / "a", tmp_path / "b", cwd=tmp_path)
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["phase"], verdict["tensor"]) == (
        0,
        "data",
        "batch.indices",
    )
    assert (
        verdict["cause"] == "data_order"
        and verdict["rng"] == ["torch"]
        and verdict["confidence"] == "proven"
    )
    assert "generator=torch.Generator().manual_seed(seed)" in verdict["fix"]


def test_identical_runs_of_a_script(copy_of_script: Path, tmp_path: Path) -> None:
    for name in "ab":
        run_script(copy_of_script, "--out", name, "--steps", "6", "--every", "3", cwd=tmp_path)
    code, report, _ = compare(tmp_path / "a", tmp_path / "b", cwd=tmp_path)
    assert code == 0 and report["identical"]


def test_a_script_changed_since_recording_is_not_replayed_unless_accepted(
    reseeded_pair: tuple[Path, Path],
) -> None:
    tmp_path, copy_of_script = reseeded_pair
    copy_of_script.write_text(SCRIPT.read_text() + "\n# edited\n")
    code, report, _ = compare(tmp_path / "a", tmp_path / "b", cwd=tmp_path)
    assert (
        code == 1
        and not report["replay"]["performed"]
        and report["verdict"]["confidence"] == "inferred"
    )
    [note] = [n for n in report["notes"] if n.startswith("no replay")]
    assert "changed since the run was recorded" in note and "--accept-changed-code" in note
    verdict = report["verdict"]
    assert verdict["step"] == 9 and verdict["reseeded"], verdict  # the step log recorded the reseed
    code, report, _ = compare(tmp_path / "a", tmp_path / "b", "--accept-changed-code", cwd=tmp_path)
    assert (
        code == 1 and report["replay"]["performed"] and report["verdict"]["confidence"] == "proven"
    )


def test_the_replay_ends_the_script_at_the_end_of_its_loop(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from pathlib import Path
            import torch
            from torch import nn
            from bisect_repro import Recorder, RecordOptions, Trainee

            torch.manual_seed(0)
            model = nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            batches = [torch.randn(8, 4) for _ in range(4)]
            trainee, options = Trainee(model, optimizer, batches), RecordOptions(steps=4, every=2)
            with Recorder(sys.argv[1], trainee, options) as recorder:
                for batch in recorder.batches():
                    if recorder.step == 3 and len(sys.argv) > 2:
                        torch.seed()
                    optimizer.zero_grad()
                    loss = model(batch).pow(2).mean() * (1 + 0.01 * torch.rand(()))
                    loss.backward()
                    optimizer.step()
                    recorder.log(loss)
            Path(sys.argv[1] + ".after").write_text("the rest of the script ran")
            """
        )
    )
    run_script(script, str(tmp_path / "a"), cwd=tmp_path)
    run_script(script, str(tmp_path / "b"), "reseed", cwd=tmp_path)
    for marker in tmp_path.glob("*.after"):
        marker.unlink()
    code, report, _ = compare(tmp_path / "a", tmp_path / "b", cwd=tmp_path)
    assert (
        code == 1 and report["verdict"]["step"] == 3 and report["verdict"]["cause"] == "rng_state"
    )
    # the replays ended when compare was done, before the rest of the script
    assert not list(tmp_path.glob("*.after"))


def test_a_script_that_fails_before_its_recorder_is_reported_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT.read_text())
    run_script(script, "--out", "a", "--steps", "4", "--every", "2", cwd=tmp_path)
    run_script(
        script, "--out", "b", "--steps", "4", "--every", "2", "--reseed-at", "1", cwd=tmp_path
    )
    environment = {**os.environ, "FAIL_EARLY": "1"}
    failing = (
        "import argparse\nimport os\n\nif os.environ.get('FAIL_EARLY'):\n    raise "
        "SystemExit('no data here')\n"
    )
    script.write_text(SCRIPT.read_text().replace("import argparse\n", failing, 1))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisect_repro.cli",
            "compare",
            "a",
            "b",
            "--json",
            "--accept-changed-code",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["verdict"]["confidence"] == "inferred"
    [note] = [n for n in report["notes"] if "replay failed" in n]
    assert "no data here" in note and "Traceback" not in done.stderr
