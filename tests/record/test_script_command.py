"""How ``record -- COMMAND`` reads a command: an interpreter and a script or module, or torchrun on
one node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bisect_repro.errors import BisectReproError
from bisect_repro.record.script import is_launcher, parse_command
from bisect_repro.record.torchrun import torchrun_command
from bisect_repro.store.meta import CodeKind


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('training')\n")
    return tmp_path / "train.py"


@pytest.mark.parametrize(
    "words",
    [
        ["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "3"],
        ["torchrun", "--nproc_per_node=2", "--standalone", "train.py", "--lr", "3"],
        [
            "/usr/bin/torchrun",
            "--nnodes",
            "1",
            "--nproc-per-node=2",
            "--master-port",
            "29500",
            "train.py",
            "--lr",
            "3",
        ],
        [
            "python3",
            "-m",
            "torch.distributed.run",
            "--node_rank=0",
            "--nproc-per-node",
            "2",
            "train.py",
            "--lr",
            "3",
        ],
    ],
)
def test_torchrun_on_one_node_runs_the_script_on_its_ranks(script: Path, words: list[str]) -> None:
    assert is_launcher(words)
    command = parse_command(words)
    assert (command.kind, command.path, command.argv, command.nproc) == (
        CodeKind.SCRIPT,
        str(script),
        ("train.py", "--lr", "3"),
        2,
    )


def test_torchrun_runs_a_module_and_python_runs_one_process(script: Path) -> None:
    module = parse_command(
        ["torchrun", "--nproc-per-node", "4", "-m", "pkg.train", "--epochs", "1"]
    )
    assert (module.kind, module.module, module.argv, module.nproc) == (
        CodeKind.MODULE,
        "pkg.train",
        ("pkg.train", "--epochs", "1"),
        4,
    )
    # torchrun's default: one rank
    assert parse_command(["torchrun", "--module", "pkg.train"]).nproc == 1
    plain = parse_command([sys.executable, "train.py"])
    assert plain.nproc is None and not is_launcher([sys.executable, "train.py"])


def test_torchrun_on_several_nodes_passes_the_rendezvous_to_the_launcher(script: Path) -> None:
    words = [
        "torchrun",
        "--nnodes",
        "2",
        "--node_rank=1",
        "--nproc-per-node",
        "3",
        "--rdzv-backend",
        "c10d",
    ]
    command = parse_command([*words, "--rdzv-endpoint", "10.0.0.1:29400", "train.py", "--lr", "3"])
    assert (command.nproc, command.argv) == (3, ("train.py", "--lr", "3"))
    assert command.launcher == (
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
    )
    launcher = torchrun_command(3, command.launcher)
    assert (
        "--standalone" not in launcher
        and launcher[-1] == "--nproc-per-node=3"
        and "--rdzv-endpoint=10.0.0.1:29400" in launcher
    )
    assert parse_command(["torchrun", "--nnodes", "1", "train.py"]).launcher == ()
    assert "--standalone" in torchrun_command(2)


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (
            ["torchrun", "--nnodes", "2", "train.py"],
            "torchrun --nnodes 2 needs where the nodes meet: give --rdzv-endpoint HOST:PORT",
        ),
        (
            ["torchrun", "--nnodes", "1:4", "train.py"],
            "torchrun --nnodes '1:4' is not a value it takes",
        ),
        (
            ["torchrun", "--nnodes=2", "--standalone", "--rdzv-endpoint=h:1", "train.py"],
            "--standalone is one node, --nnodes 2 several",
        ),
        (
            ["torchrun", "--rdzv-backend", "c10d;rm", "train.py"],
            "torchrun --rdzv-backend 'c10d;rm' is not a value it takes",
        ),
        (
            ["torchrun", "--max-restarts", "3", "train.py"],
            "torchrun option --max-restarts is not supported",
        ),
        (["torchrun", "--no-python", "train.py"], "torchrun option --no-python is not supported"),
        (
            ["torchrun", "--nproc-per-node", "gpu", "train.py"],
            "--nproc-per-node 'gpu' is not a number of ranks",
        ),
        (["torchrun", "--nproc-per-node"], "torchrun option --nproc-per-node needs a value"),
        (["torchrun", "--standalone"], "names no script"),
        (["torchrun", "missing.py"], "missing.py: no such script"),
    ],
)
def test_a_torchrun_command_that_cannot_be_recorded_is_refused_with_the_fix(
    script: Path, words: list[str], says: str
) -> None:
    with pytest.raises(BisectReproError) as raised:
        parse_command(words)
    assert says in str(raised.value) and "\n" not in str(raised.value)
