"""The scripts of ``test_unchanged_scripts`` adopted with the Recorder API instead: each needs at
most five changed lines (blank lines aside), none re-indented, and records the run it should; a
planted bug in one of them is found from a checkpoint."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ADOPTED = {  # the script as written, its adoption
    "gpt_style.py": "adopted/gpt_style.py",
    "word_lm.py": "adopted/word_lm.py",
    "loader_loop.py": "adopted/loader_loop.py",
    "library/trainer.py": "adopted/trainer.py",
    "ddp_torchrun.py": "adopted/ddp_torchrun.py",
}


def changed_lines(before: list[str], after: list[str]) -> tuple[int, list[str]]:
    """Lines added, removed or rewritten (a rewritten line counts once; blank lines not at all), and
    the lines that only moved right or left (re-indented)."""
    changed, reindented = 0, []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old = [line for line in before[i1:i2] if line.strip()]
        new = [line for line in after[j1:j2] if line.strip()]
        changed += max(len(old), len(new))
        stripped = {line.strip() for line in old}
        reindented += [line for line in new if line.strip() in stripped and line not in old]
    return changed, reindented


def test_changed_lines_counts_rewrites_once_and_sees_reindentation() -> None:
    before = ["a = 1", "for x in y:", "    f(x)", "", "g()"]
    after = ["import r", "a = 1", "for x in r(y):", "        f(x)", "g()"]
    # the import, the loop, the body moved right
    assert changed_lines(before, after) == (3, ["        f(x)"])
    assert changed_lines(before, before) == (0, [])


@pytest.mark.parametrize(("script", "adopted"), ADOPTED.items())
def test_each_script_takes_the_recorder_in_at_most_five_lines_none_reindented(
    script: str, adopted: str
) -> None:
    changed, reindented = changed_lines(
        (SCRIPTS / script).read_text().splitlines(), (SCRIPTS / adopted).read_text().splitlines()
    )
    assert 0 < changed <= 5 and reindented == [], (changed, reindented)


def _run(folder: Path, *command: str) -> None:
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _shown(folder: Path) -> dict:
    shown = subprocess.run(
        [sys.executable, "-m", "bisect_repro.cli", "show", "run", "--json"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    return json.loads(shown.stdout)


@pytest.mark.extended
@pytest.mark.slow
def test_the_adopted_scripts_record_their_steps(tmp_path: Path) -> None:
    steps = {
        "gpt_style.py": 10,
        "word_lm.py": 6,
        "loader_loop.py": 16,
        "library/trainer.py": 10,
        "ddp_torchrun.py": 12,
    }
    for script, adopted in ADOPTED.items():
        folder = tmp_path / Path(script).stem
        folder.mkdir()
        shutil.copy(SCRIPTS / adopted, folder / Path(script).name)
        if script == "library/trainer.py":
            shutil.copy(SCRIPTS / "library" / "train.py", folder / "train.py")
            _run(folder, sys.executable, "train.py")
        elif script == "ddp_torchrun.py":
            _run(
                folder,
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                "ddp_torchrun.py",
            )
        else:
            _run(folder, sys.executable, Path(script).name)
        shown = _shown(folder)
        assert shown["complete"] and shown["steps_logged"] == steps[script], (script, shown)


@pytest.mark.slow
def test_a_reseed_in_the_adopted_gpt_style_script_is_proven_from_a_checkpoint(
    tmp_path: Path,
) -> None:
    for name, extra in (("a", ()), ("b", ("--reseed-at", "6"))):
        (tmp_path / name).mkdir()
        shutil.copy(SCRIPTS / "adopted" / "gpt_style.py", tmp_path / name / "train.py")
        _run(tmp_path / name, sys.executable, "train.py", *extra)
    command = [sys.executable, "-m", "bisect_repro.cli", "compare", "a/run", "b/run", "--json"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    verdict = result["verdict"]
    where = (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["cause"],
        verdict["rng"],
        verdict["confidence"],
    )
    assert where == (6, "forward", "drop", "rng_state", ["torch"], "proven"), verdict
    # the global iter_num is held by the checkpoint: replayed from it, not from the start
    replay = result["replay"]
    assert (replay["from_step"], replay["replayed_steps"]) == (4, 3), replay
