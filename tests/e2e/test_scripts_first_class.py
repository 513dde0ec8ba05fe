"""Scripts recorded unchanged, as first-class as recipes: a GAN's two optimizers both followed, the
loss of each step recorded, ``show`` naming the command, and ``doctor`` on a script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import run_cli

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture(scope="module")
def gan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of the tiny GAN, the second with the generator's learning rate doubled."""
    folder = tmp_path_factory.mktemp("gan")
    (folder / "gan.py").write_text((SCRIPTS / "tiny_gan.py").read_text())
    for out, extra in (("a", ()), ("b", ("--lr-g", "0.004"))):
        done = run_cli(
            "record",
            "--out",
            out,
            "--every",
            "2",
            "--checkpoint-every",
            "2",
            "--",
            "python",
            "gan.py",
            *extra,
            cwd=folder,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return folder


def test_show_prints_a_scripts_command_directory_hash_and_losses(gan: Path) -> None:
    shown = json.loads(run_cli("show", "a", "--json", cwd=gan).stdout)
    assert (
        shown["command"] == f"python {gan / 'gan.py'}"
        and shown["cwd"] == str(gan)
        and shown["target"] is None
    )
    assert shown["script"] == str(gan / "gan.py") and len(shown["script_sha256"]) == 64
    assert (
        shown["steps_logged"] == 6
        and shown["first_loss"] is not None
        and shown["last_loss"] is not None
    )
    text = " ".join(run_cli("show", "b", cwd=gan).stdout.split())
    assert (
        "command python" in text
        and "--lr-g 0.004" in text
        and "target" not in text
        and "first None" not in text
    )
    b = json.loads(run_cli("show", "b", "--json", cwd=gan).stdout)
    # step 0's loss comes before any update, so only later ones see the doubled learning rate
    assert (
        b["first_loss"] == pytest.approx(shown["first_loss"])
        and b["last_loss"] != shown["last_loss"]
    )


@pytest.mark.slow
def test_a_gans_second_optimizer_is_followed_and_named_where_its_setting_parts_the_runs(
    gan: Path,
) -> None:
    names = json.loads(run_cli("show", "a", "--json", cwd=gan).stdout)
    assert names["model"]["parameters"] == 8  # both parts: netD's four tensors and netG's four
    done = run_cli("compare", "a", "b", "--json", cwd=gan)
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    verdict = result["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["layer"], verdict["tensor"]) == (
        0,
        "optimizer",
        "netG.main.0",
        "netG.main.0.weight",
    )
    records = json.loads(run_cli("compare", "a", "b", "--json", "--no-replay", cwd=gan).stdout)[
        "verdict"
    ]
    evidence = " ".join(e["detail"] for e in records["evidence"])
    assert (
        "the non-tensor state differs at step 0: optimizer1.group0.lr (0.002 vs 0.004)" in evidence
    ), evidence


def test_an_optimizer_made_after_the_first_step_is_a_one_line_note(tmp_path: Path) -> None:
    (tmp_path / "gan.py").write_text((SCRIPTS / "tiny_gan.py").read_text())
    done = run_cli(
        "record",
        "--out",
        "late",
        "--",
        "python",
        "gan.py",
        "--iterations",
        "3",
        "--late-optimizer",
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    notes = [
        line
        for line in done.stderr.splitlines()
        if "an optimizer (SGD) was made after the first step began" in line
    ]
    assert len(notes) == 1 and "not followed" in notes[0]


@pytest.mark.extended
@pytest.mark.slow
def test_doctor_runs_a_scripts_proof_and_finds_the_step_that_reseeds(tmp_path: Path) -> None:
    """The same script without the bug is found reproducible by the corpus's doctor tests
    (tests/e2e/test_corpus.py), in the same report format."""
    script = tmp_path / "loop.py"
    script.write_text((SCRIPTS / "tiny_regression.py").read_text())
    buggy = run_cli(
        "doctor",
        "--steps",
        "2",
        "--json",
        "--",
        "python",
        "loop.py",
        "--reseed-at",
        "1",
        cwd=tmp_path,
    )
    assert buggy.returncode == 1, buggy.stderr[-2000:]
    report = json.loads(buggy.stdout)
    assert (
        not report["reproducible"]
        and report["target"] == "python loop.py --reseed-at 1"
        and report["steps"] == 2
    )
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    line = next(
        n for n, text in enumerate(script.read_text().splitlines(), 1) if "torch.seed()" in text
    )
    assert any(
        f["id"] == "reseeded-stream:torch" and f"loop.py:{line}" in f["evidence"] for f in errors
    ), errors


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--", "python", "-m", "somewhere.train"],
            "doctor: no module somewhere.train is found from",
        ),
        (
            ["--set", "lr=1", "--", "python", "loop.py"],
            "doctor: --set is for a recipe; a script takes its own arguments after --",
        ),
        (["--", "python", "missing.py"], "missing.py: no such script; check the path"),
    ],
)
def test_doctor_refuses_what_is_not_a_script_in_one_line(
    tmp_path: Path, args: list[str], says: str
) -> None:
    (tmp_path / "loop.py").write_text("print('never run')\n")
    done = run_cli("doctor", *args, cwd=tmp_path)
    assert (
        done.returncode == 2
        and says in " ".join(done.stderr.split())
        and "Traceback" not in done.stderr
    ), done.stderr
