"""Fork servers: what they preload, and copies that start as fresh replaying processes would.

The copies here run the bootstrap on a recipe that writes what a fresh process must have (its own
streams, the environment asked for, MKL's first call made) to its output, then stops with a
one-line error: exit code 2, reported truthfully by the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from bisect_repro.replay.bootstrap import SPEC_VARIABLE
from bisect_repro.replay.forks import ForkedProcess, forking, preloads, servers

ROOT = str(Path(__file__).resolve().parents[2])

REPORTING = """
import gc, json, os, random
import numpy as np
import torch
from bisect_repro.capture import vml
from bisect_repro.errors import BisectReproError

def build():
    print(json.dumps({
        "python": random.random(), "numpy": float(np.random.rand()), "torch": torch.initial_seed(),
        "variable": os.environ.get("FORKED_VALUE"), "cwd": os.getcwd(), "settled": vml.settled,
        "mkl": torch.backends.mkl.is_available(), "sum": float(torch.ones(1 << 16).sqrt().sum()),
        "frozen": gc.get_freeze_count(),
    }))
    raise BisectReproError("reported; stopping here")
"""


def _environment(recipe: Path, value: str, hash_seed: str = "0") -> dict[str, str]:
    spec = {"kind": "recipe", "target": f"{recipe}:build", "path": str(recipe), "config": {}}
    base = {k: v for k, v in os.environ.items() if not k.startswith("BISECT_REPRO_")}
    return {
        **base,
        "PYTHONPATH": ROOT,
        "PYTHONHASHSEED": hash_seed,
        "FORKED_VALUE": value,
        SPEC_VARIABLE: json.dumps(spec),
    }


def _never() -> subprocess.Popen[bytes]:
    raise AssertionError("the server forks: no fresh process is started")


def _report(log: Path) -> dict[str, object]:
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines, log.read_text()
    return json.loads(lines[-1])


@pytest.mark.slow
def test_copies_start_as_fresh_processes_and_their_exit_codes_are_reported(tmp_path: Path) -> None:
    recipe = tmp_path / "reporting.py"
    recipe.write_text(REPORTING)
    folders = [tmp_path / f"cwd{i}" for i in range(3)]
    for folder in folders:
        folder.mkdir()
    private = {SPEC_VARIABLE, "FORKED_VALUE"}
    with forking() as forks:
        assert servers() is forks
        environments = [_environment(recipe, f"value {i}", "0" if i < 2 else "1") for i in range(3)]
        copies = [
            forks.start(
                environments[i], private, ["torch"], str(folders[i]), folders[i] / "log", _never
            )
            for i in range(3)
        ]
        assert all(isinstance(copy, ForkedProcess) for copy in copies)
        codes = [copy.wait(timeout=120) for copy in copies if copy is not None]
        assert (forks.started, forks.forked) == (2, 3)  # another PYTHONHASHSEED: another server
    assert servers() is None
    assert codes == [2, 2, 2]  # the bootstrap's one-line error, as a fresh process exits
    reports = [_report(folder / "log") for folder in folders]
    assert "reported; stopping here" in (folders[0] / "log").read_text()
    assert [r["variable"] for r in reports] == ["value 0", "value 1", "value 2"]
    assert [os.path.realpath(str(r["cwd"])) for r in reports] == [
        os.path.realpath(f) for f in folders
    ]
    # drawn anew in each copy (a fresh process draws its own), not the server's
    for stream in ("python", "numpy", "torch"):
        assert reports[0][stream] != reports[1][stream], stream
    # what a fresh process does, so a shared seed would differ from it
    assert torch_default_seed() != torch_default_seed()
    # and torch computes on threads of its own (no hang)
    assert reports[0]["sum"] == reports[1]["sum"] == float(1 << 16)
    if reports[0]["mkl"]:
        assert all(int(str(r["settled"])) > 0 for r in reports)  # MKL's first call made in the copy
    # the server's imports, out of the copies' collections
    assert all(int(str(r["frozen"])) > 10_000 for r in reports)


def exiting_with_7(started: list[int]) -> Callable[[], subprocess.Popen[bytes]]:
    """A fresh process's start, for a server that cannot fork: it exits with 7; its pid goes to
    ``started``."""

    def start_afresh() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
        started.append(process.pid)
        return process

    return start_afresh


def torch_default_seed() -> int:
    found = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.initial_seed())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(found.stdout)


@pytest.mark.slow
def test_a_server_whose_imports_started_threads_starts_every_process_afresh(tmp_path: Path) -> None:
    # a library it preloads, shadowed on the import path by one whose import runs a parallel op (an
    # OpenMP team, which a fork leaves behind)
    (tmp_path / "torchaudio.py").write_text("import torch\ntorch.ones(1 << 20).exp()\n")
    recipe = tmp_path / "reporting.py"
    recipe.write_text(REPORTING)
    environment = {
        **_environment(recipe, "x"),
        "PYTHONPATH": os.pathsep.join((ROOT, str(tmp_path))),
        "OMP_NUM_THREADS": "2",
    }
    fresh: list[int] = []
    start_afresh = exiting_with_7(fresh)
    with forking() as forks:
        first = forks.start(
            environment,
            {SPEC_VARIABLE},
            ["torchaudio"],
            str(tmp_path),
            tmp_path / "log",
            start_afresh,
        )
        assert first is not None and first.wait(timeout=120) == 7 and first.pid == fresh[0]
        later = forks.start(
            environment,
            {SPEC_VARIABLE},
            ["torchaudio"],
            str(tmp_path),
            tmp_path / "log",
            start_afresh,
        )
        assert later is None  # the server is known unfit: the caller starts its own process
        assert (forks.started, forks.forked) == (1, 0)
    assert len(fresh) == 1


@pytest.mark.slow
def test_a_server_imports_no_module_but_the_libraries_it_preloads(tmp_path: Path) -> None:
    (tmp_path / "planted.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n"
    )
    recipe = tmp_path / "reporting.py"
    recipe.write_text(REPORTING)
    environment = {
        **_environment(recipe, "x"),
        "PYTHONPATH": os.pathsep.join((ROOT, str(tmp_path))),
    }
    with forking() as forks:
        copy = forks.start(
            environment,
            {SPEC_VARIABLE},
            ["planted", "planted:x"],
            str(tmp_path),
            tmp_path / "log",
            _never,
        )
        assert copy is not None and copy.wait(timeout=120) == 2
    assert not (tmp_path / "imported").exists()


def test_a_copy_killed_before_it_was_forked_is_killed_when_it_is() -> None:
    copy = ForkedProcess(_never)
    copy.kill()
    probe = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    copy._forked(probe.pid)
    assert probe.wait(timeout=10) == -9
    copy._exited(-9)
    assert copy.poll() == copy.wait(timeout=1) == -9


def test_the_preloads_are_the_heavy_libraries_the_code_imports_and_nothing_it_would_shadow(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import argparse, torch
            import lightning as L
            from torch.utils.data import DataLoader
            from transformers import Trainer, TrainingArguments
            from . import sibling
            from mypackage import helper

            def main():
                import torchvision.transforms
            """
        )
    )
    found = preloads(str(script))
    assert found == [
        "torch",
        "lightning",
        "torch.utils.data",
        "torch.utils.data:DataLoader",
        "transformers",
        "transformers:Trainer",
        "transformers:TrainingArguments",
        "torchvision.transforms",
    ]
    (tmp_path / "lightning").mkdir()  # a folder beside the script would be imported instead
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "transformers.py").write_text("")
    assert "lightning" not in preloads(str(script))
    assert not any(
        name.startswith("transformers") for name in preloads(str(script), (str(elsewhere),))
    )
    (tmp_path / "broken.py").write_text("def (:\n")
    assert (
        preloads(str(tmp_path / "broken.py")) == []
        and preloads(str(tmp_path / "missing.py")) == []
        and preloads(None) == []
    )
