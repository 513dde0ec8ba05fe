"""The launch spec of a run: what a replay would run, checked before anything runs (no process is
started here)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from bisect_repro.replay.launch import (
    REPLAYED_VARIABLES,
    ReplayUnavailable,
    spec_for_recipe,
    spec_for_run,
)
from bisect_repro.store.meta import CodeKind
from bisect_repro.store.run import Run
from bisect_repro.store.writer import RunWriter


def fake_run(path: Path, code: Path, **extra) -> Run:
    digest = hashlib.sha256(code.read_bytes()).hexdigest()
    meta = {
        "target": None,
        "config": {},
        "environment": {
            "env.OMP_NUM_THREADS": "2",
            "env.PYTHONPATH": "/tmp/evil",
            "env.LD_PRELOAD": "/tmp/x.so",
            "env.PYTHONHASHSEED": None,
        },
        "launch": {
            "argv": [str(code), "--lr", "0.1"],
            "cwd": str(code.parent),
            "code": {"kind": "script", "path": str(code), "sha256": digest},
        },
        **extra,
    }
    RunWriter.create(path, meta).close()
    return Run.open(path)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    path = tmp_path / "code" / "train.py"
    path.write_text("print('training')\n")
    return path


def test_a_signed_script_run_replays_its_own_file_with_only_the_numeric_variables(
    tmp_path: Path, script: Path
) -> None:
    spec = spec_for_run(fake_run(tmp_path / "run", script))
    assert spec.signed and spec.kind is CodeKind.SCRIPT and spec.path == str(script.resolve())
    assert (
        spec.variables == {"OMP_NUM_THREADS": "2", "PYTHONHASHSEED": None}
        and set(spec.variables) <= REPLAYED_VARIABLES
    )
    announced = "\n".join(spec.announcement())
    assert (
        f"file: {script.resolve()} (sha256 {spec.sha256})" in announced
        and f"working directory: {script.parent}" in announced
    )
    assert (
        "sets: OMP_NUM_THREADS=2" in announced
        and "unsets: PYTHONHASHSEED" in announced
        and "PYTHONPATH" not in announced
    )


def test_an_edited_run_is_not_signed(tmp_path: Path, script: Path) -> None:
    run = fake_run(tmp_path / "run", script)
    meta = json.loads((run.path / "run.json").read_text())
    meta["launch"]["argv"].append("--evil")
    (run.path / "run.json").write_text(json.dumps(meta))
    assert not spec_for_run(Run.open(run.path)).signed


def test_a_world_size_this_machine_cannot_run_is_refused(tmp_path: Path, script: Path) -> None:
    distributed = {"world_size": 4 * (os.cpu_count() or 1) + 1, "backend": "gloo", "layout": "ddp"}
    RunWriter.create(
        tmp_path / "run", {"target": None, "distributed": distributed}, rank_meta={"rank": 0}
    ).close()
    run = Run.open(tmp_path / "run")
    with pytest.raises(ReplayUnavailable, match="more than this machine runs"):
        spec_for_run(run)


def test_a_value_that_is_not_short_printable_text_is_refused(tmp_path: Path, script: Path) -> None:
    run = fake_run(tmp_path / "run", script, environment={"env.OMP_NUM_THREADS": "2\n" + "x" * 300})
    with pytest.raises(ReplayUnavailable, match="OMP_NUM_THREADS is not short printable text"):
        spec_for_run(run)


def test_control_characters_never_reach_the_announcement(tmp_path: Path, script: Path) -> None:
    run = fake_run(tmp_path / "run", script)
    meta = json.loads((run.path / "run.json").read_text())
    meta["launch"]["argv"] += ["\x1b[2K\x1b[1Gall fine", "[red]x[/red]", "\u202eevil"]
    (run.path / "run.json").write_text(json.dumps(meta))
    lines = spec_for_run(Run.open(run.path)).announcement()
    assert (
        not any(ch in line for line in lines for ch in "\x1b\u202e")
        and "\\x1b[2K\\x1b[1Gall fine" in lines[0]
        and "[red]x[/red]" in lines[0]
    )


def test_a_module_is_run_from_the_root_its_file_lies_under(tmp_path: Path) -> None:
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("")
    digest = hashlib.sha256(b"").hexdigest()
    launch = {
        "argv": ["x"],
        "cwd": str(tmp_path),
        "code": {
            "kind": "module",
            "module": "pkg.train",
            "path": str(package / "train.py"),
            "sha256": digest,
        },
    }
    RunWriter.create(tmp_path / "run", {"target": None, "launch": launch}).close()
    spec = spec_for_run(Run.open(tmp_path / "run"))
    assert (
        spec.root == str(tmp_path / "src")
        and spec.module == "pkg.train"
        and spec.describe().startswith("python -m pkg.train")
    )


def test_a_recipe_named_here_is_the_users_own_decision(
    tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(script.parent)
    spec = spec_for_recipe(
        "train.py:build", {"lr": 0.1}, {"PYTHONHASHSEED": "1", "LD_PRELOAD": "/x.so"}
    )
    assert (
        spec.signed
        and spec.target == f"{script.resolve()}:build"
        and spec.cwd == str(script.parent)
    )
    assert spec.variables == {"PYTHONHASHSEED": "1"}
