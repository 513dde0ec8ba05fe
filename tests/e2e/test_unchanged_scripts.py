"""``bisect-repro record --out DIR -- python train.py``: scripts that know nothing of bisect-repro,
recorded unchanged and replayed by running them again under the same hooks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app
from bisect_repro.serve.protocol import Hello
from tests.e2e.cli import run_cli

SCRIPTS = Path(__file__).resolve().parent / "scripts"
runner = CliRunner()


def _recorded(folder: Path, out: str, *command: str) -> None:
    done = run_cli(
        "record",
        "--out",
        out,
        "--every",
        "2",
        "--checkpoint-every",
        "4",
        "--",
        *command,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _line_of(script: Path, text: str) -> int:
    return next(
        number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line
    )


@pytest.mark.extended
def test_a_gpt_style_script_with_prefetch_accumulation_and_a_global_counter(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "gpt_style.py").read_text())
    for out, extra in (("a", ()), ("again", ()), ("b", ("--reseed-at", "6"))):
        _recorded(tmp_path, out, "python", "train.py", *extra)
    shown = json.loads(run_cli("show", "a", "--json", cwd=tmp_path).stdout)
    assert (
        shown["complete"]
        and shown["steps_logged"] == 10
        and shown["snapshots"] == [0, 2, 4, 6, 8, 10]
    )
    done = run_cli("compare", "a", "b", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert (
        "replaying run B by running: python" in " ".join(done.stderr.split())
        and "(under bisect-repro's hooks)" in done.stderr
    )
    verdict = json.loads(done.stdout)["verdict"]
    where = (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["op"],
        verdict["cause"],
        verdict["rng"],
    )
    assert where == (6, "forward", "drop", "aten.bernoulli_.float", "rng_state", ["torch"]), verdict
    assert (
        verdict["confidence"] == "proven"
        and verdict["reseeded"][0]["where"] == f"{script}:{_line_of(script, 'torch.seed()')}"
    )


@pytest.mark.extended
def test_a_loader_loop_reseeded_at_an_epoch_or_with_unseeded_noise_is_found_where_it_parts(
    tmp_path: Path,
) -> None:
    script = tmp_path / "loop.py"
    script.write_text((SCRIPTS / "loader_loop.py").read_text())
    _recorded(tmp_path, "a", "python", "loop.py")
    _recorded(tmp_path, "b", "python", "loop.py", "--reseed-at-epoch", "1")
    done = run_cli("compare", "a", "b", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    verdict = json.loads(done.stdout)["verdict"]
    where = (
        verdict["step"],
        verdict["phase"],
        verdict["cause"],
        verdict["rng"],
        verdict["confidence"],
    )
    # 128 samples in batches of 16: epoch 1 starts at 8
    assert where == (8, "data", "rng_state", ["torch"], "proven"), verdict
    assert "between steps 7 and 8" in verdict["explanation"], verdict["explanation"]
    assert verdict["reseeded"][0]["where"] == f"{script}:{_line_of(script, 'torch.seed()')}"
    # the same samples, other noise added to them
    _recorded(tmp_path, "noisy", "python", "loop.py", "--unseeded-noise")
    done = run_cli("compare", "a", "noisy", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    verdict = json.loads(done.stdout)["verdict"]
    assert (verdict["step"], verdict["phase"], verdict["cause"], verdict["confidence"]) == (
        0,
        "data",
        "data_content",
        "proven",
    ), verdict
    assert "draws another batch" in " ".join(e["detail"] for e in verdict["evidence"])


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            ["notpython", "train.py"],
            "not a Python interpreter or torchrun; give the command as: -- python train.py ARGS",
        ),
        (["python", "missing.py"], "missing.py: no such script; check the path"),
        (["python", "-O", "train.py"], "names no script (interpreter options are not supported)"),
    ],
)
def test_a_command_that_is_not_python_running_a_script_is_refused_in_one_line(
    tmp_path: Path, command: list[str], says: str
) -> None:
    result = runner.invoke(app, ["record", "--out", str(tmp_path / "r"), "--", *command])
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


@pytest.mark.extended
def test_a_hand_written_sgd_script_with_no_optimizer_diverging_by_thread_count(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text((SCRIPTS / "word_lm.py").read_text())
    _recorded(tmp_path, "a", "python", "train.py", "--threads", "1")
    _recorded(tmp_path, "b", "python", "train.py", "--threads", "2")
    # one step per backward()
    assert json.loads(run_cli("show", "a", "--json", cwd=tmp_path).stdout)["steps_logged"] == 6
    done = run_cli("compare", "a", "b", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    verdict = json.loads(done.stdout)["verdict"]
    assert (verdict["step"], verdict["cause"], verdict["confidence"]) == (
        0,
        "environment",
        "proven",
    ), verdict
    assert (
        verdict["environment_keys"] == ["torch.get_num_threads"]
        and "torch.set_num_threads" in verdict["fix"]
    )


@pytest.mark.extended
def test_a_loop_that_lives_in_a_library_is_recorded_through_its_optimizer_and_model(
    tmp_path: Path,
) -> None:
    for name in ("train.py", "trainer.py"):
        (tmp_path / name).write_text((SCRIPTS / "library" / name).read_text())
    _recorded(tmp_path, "a", "python", "train.py")
    _recorded(tmp_path, "b", "python", "train.py", "--reseed-at", "5")
    done = run_cli("compare", "a", "b", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    verdict = json.loads(done.stdout)["verdict"]
    where = (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["cause"],
        verdict["rng"],
        verdict["confidence"],
    )
    # reseeded after step 5's optimizer step
    assert where == (6, "forward", "2", "rng_state", ["torch"], "proven"), verdict
    assert (
        verdict["reseeded"][0]["where"]
        == f"{tmp_path / 'train.py'}:{_line_of(tmp_path / 'train.py', 'torch.seed()')}"
    )


@pytest.mark.extended
@pytest.mark.slow
def test_the_users_own_torchrun_is_recorded_on_each_rank_and_replayed_under_torchrun(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "ddp_torchrun.py").read_text())
    _recorded(tmp_path, "a", "torchrun", "--nproc-per-node", "2", "train.py")
    _recorded(tmp_path, "b", "torchrun", "--nproc-per-node", "2", "train.py", "--reseed-at", "9")
    shown = json.loads(run_cli("show", "a", "--json", cwd=tmp_path).stdout)
    assert (
        shown["complete"]
        and shown["steps_logged"] == 12
        and (tmp_path / "a" / "rank1" / "steps.jsonl").is_file()
    )
    done = run_cli("compare", "a", "b", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "replaying run B by running: torchrun --standalone --nproc-per-node 2" in " ".join(
        done.stderr.split()
    )
    result = json.loads(done.stdout)
    verdict = result["verdict"]
    where = (
        verdict["step"],
        verdict["rank"],
        verdict["phase"],
        verdict["layer"],
        verdict["cause"],
        verdict["rng"],
        verdict["confidence"],
    )
    assert where == (9, 1, "forward", "module.2", "rng_state", ["torch"], "proven"), verdict
    # the reseed given its recorded seed
    assert result["replay"]["faithful"] and result["replay"]["parted"] == [], result["replay"]
    assert verdict["reseeded"][0]["where"] == f"{script}:{_line_of(script, 'torch.seed()')}"
    # rank 0 reseeded nothing: it parts through DDP's all-reduce
    followed = result["ranks"][0]["verdict"]
    assert (followed["step"], followed["cause"], followed["confidence"]) == (
        9,
        "rng_state",
        "inferred",
    )
    assert "rank 1 parted first" in followed["explanation"]


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DataLoader loop with a per-step schedule, reseeded at step 6 in run B; and the same loop
    scaling its learning rate by its own enumerate counter (``counted``, ``counted_b``)."""
    folder = tmp_path_factory.mktemp("scheduled")
    (folder / "loop.py").write_text((SCRIPTS / "scheduled_loop.py").read_text())
    runs = {
        "a": (),
        "b": ("--reseed-at", "6"),
        "counted": ("--local-counter",),
        "counted_b": ("--local-counter", "--reseed-at", "6"),
    }
    for out, extra in runs.items():
        _recorded(folder, out, "python", "loop.py", *extra)
    return folder


def _compared(
    folder: Path, a: str, b: str, monkeypatch: pytest.MonkeyPatch, *, rewinds: bool = True
) -> dict[str, Any]:
    """``compare --json`` in this process; ``rewinds=False``: as if the replaying processes could
    not rewind."""
    with monkeypatch.context() as patch:
        if not rewinds:
            told = Hello.from_json
            patch.setattr(
                Hello, "from_json", classmethod(lambda cls, data: told({**data, "rewinds": False}))
            )
        result = runner.invoke(app, ["compare", str(folder / a), str(folder / b), "--json"])
    assert result.exit_code == 1, result.output[-2000:]
    compared: dict[str, Any] = json.loads(result.stdout)
    return compared


def _where(verdict: dict[str, Any]) -> tuple[Any, ...]:
    return (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["op"],
        verdict["cause"],
        verdict["rng"],
        verdict["confidence"],
    )


RESEEDED = (6, "forward", "1", "aten.bernoulli_.float", "rng_state", ["torch"], "proven")


@pytest.mark.extended
@pytest.mark.slow
def test_a_scripts_experiments_rewind_its_replaying_process_fewer_processes_same_verdict(
    scheduled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewound = _compared(scheduled, "a", "b", monkeypatch)
    fresh = _compared(scheduled, "a", "b", monkeypatch, rewinds=False)
    assert _where(rewound["verdict"]) == RESEEDED, rewound["verdict"]
    assert rewound["verdict"] == fresh["verdict"]
    assert rewound["replay"]["processes"] < fresh["replay"]["processes"], (
        rewound["replay"],
        fresh["replay"],
    )
    assert not any("not by rewinding" in note for note in rewound["notes"]), rewound["notes"]


@pytest.mark.extended
@pytest.mark.slow
def test_a_loop_reading_its_own_counter_is_caught_when_rewound_and_run_in_fresh_processes(
    scheduled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _compared(scheduled, "counted", "counted_b", monkeypatch)
    assert _where(result["verdict"]) == RESEEDED, result["verdict"]
    notes = [note for note in result["notes"] if "not by rewinding" in note]
    assert len(notes) == 2 and "run A's step 6 is repeated in fresh processes" in notes[0], result[
        "notes"
    ]
    assert "traced other tensors than its first run" in notes[0] and "a local counter" in notes[0]
