"""Two nodes simulated on this machine: two ``torchrun --nnodes 2`` agents on 127.0.0.1 (c10d
rendezvous on a free port), one rank each, both recording into one folder through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.cli import run_cli

SCRIPT = Path(__file__).parent / "scripts" / "ddp_nodes.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _options(node: int, port: int) -> list[str]:
    return [
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
    ]


def _node(folder: Path, out: str, node: int, words: list[str]) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "bisect_repro.cli",
        "record",
        "--out",
        out,
        "--every",
        "1",
        *words,
    ]
    log = open(folder / f"{out}-node{node}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _two_nodes(folder: Path, out: str, *extra: str) -> list[subprocess.Popen[bytes]]:
    port = _free_port()
    return [
        _node(folder, out, node, ["--", "torchrun", *_options(node, port), "train.py", *extra])
        for node in (0, 1)
    ]


def _ended(nodes: list[subprocess.Popen[bytes]], timeout: float = 240) -> list[int]:
    try:
        return [node.wait(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``a`` and ``again`` seeded alike; ``b`` reseeds global rank 1 from entropy at step 7."""
    folder = tmp_path_factory.mktemp("nodes")
    shutil.copyfile(SCRIPT, folder / "train.py")
    for out, extra in (("a", ()), ("again", ()), ("b", ("--reseed-at", "7"))):
        codes = _ended(_two_nodes(folder, out, *extra))
        assert codes == [0, 0], (folder / f"{out}-node1.log").read_text(errors="replace")[-2000:]
    return folder


def test_both_nodes_record_one_run_keyed_by_global_rank(runs: Path) -> None:
    shown = json.loads(run_cli("show", "a", "--json", cwd=runs).stdout)
    assert shown["complete"] and shown["distributed"]["world_size"] == 2
    layout = shown["layout"]
    assert (layout["nnodes"], layout["nproc_per_node"], layout["partial"]) == (2, 1, False)
    assert sorted(tuple(node["ranks"]) for node in layout["nodes"]) == [(0,), (1,)]
    assert {node["node"] for node in layout["nodes"]} == {0, 1} and all(
        node["hosts"] for node in layout["nodes"]
    )
    text = " ".join(run_cli("show", "a", cwd=runs).stdout.split())
    assert "2 x 1 ranks" in text and "partial" not in text


def test_two_seeded_runs_on_two_nodes_are_identical(runs: Path) -> None:
    done = run_cli("compare", "--no-replay", "a", "again", cwd=runs)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_reseed_on_global_rank_1_is_found_at_its_step_rank_and_role(runs: Path) -> None:
    done = run_cli("compare", "--no-replay", "--json", "a", "b", cwd=runs)
    assert done.returncode == 1, done.stderr[-2000:]
    found = json.loads(done.stdout)
    verdict = found["verdict"]
    assert (verdict["step"], verdict["rank"], verdict["cause"], verdict["rng"]) == (
        7,
        1,
        "rng_state",
        ["torch"],
    )
    roles = {rank["rank"]: (rank["node"], rank["role"]) for rank in found["ranks"]}
    assert roles[1][1] == "origin" and roles[0][1] == "receiver" and roles[0][0] != roles[1][0]


def _copy(runs: Path, name: str) -> Path:
    copy = runs / name
    shutil.copytree(runs / "a", copy)
    return copy


def _rank_json(run: Path, rank: int) -> tuple[Path, dict[str, object]]:
    path = run / f"rank{rank}" / "rank.json"
    return path, json.loads(path.read_text())


def test_a_rank_folder_from_another_run_is_refused_naming_the_rank(runs: Path) -> None:
    mixed = _copy(runs, "mixed")
    shutil.rmtree(mixed / "rank1")
    shutil.copytree(runs / "b" / "rank1", mixed / "rank1")
    for command in (["show", "mixed"], ["compare", "--no-replay", "mixed", "a"]):
        done = run_cli(*command, cwd=runs)
        assert done.returncode == 2 and "rank 1 is from another run" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"node": 0}, "rank 1 duplicates rank 0: both say node 0, local rank 0"),
        (
            {"nnodes": 1, "local_world_size": 2},
            "rank 1 was launched as 1 nodes x 2 ranks, the run as 2 x 1",
        ),
    ],
)
def test_a_duplicate_rank_or_another_layout_is_refused_naming_the_rank(
    runs: Path, changes: dict[str, int], says: str
) -> None:
    edited = _copy(runs, f"edited-{len(changes)}")
    path, found = _rank_json(edited, 1)
    path.write_text(json.dumps({**found, **changes}))
    done = run_cli("show", edited.name, cwd=runs)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, (
        done.stderr
    )


@pytest.mark.extended
def test_a_rank_with_no_records_makes_the_run_partial(runs: Path) -> None:
    lost = _copy(runs, "lost")
    shutil.rmtree(lost / "rank1")
    shown = json.loads(run_cli("show", "lost", "--json", cwd=runs).stdout)
    assert (
        shown["layout"]["missing"] == [1] and shown["layout"]["partial"] and not shown["complete"]
    )
    assert "rank 1 missing" in " ".join(run_cli("show", "lost", cwd=runs).stdout.split())
    done = run_cli("compare", "--no-replay", "lost", "a", cwd=runs)
    assert done.returncode == 2 and "partial run: rank 1 has no records" in done.stderr, done.stderr


def test_a_node_killed_midway_leaves_a_partial_run_that_show_names(tmp_path: Path) -> None:
    shutil.copyfile(SCRIPT, tmp_path / "train.py")
    nodes = _two_nodes(tmp_path, "killed", "--step-seconds", "0.5")
    steps = tmp_path / "killed" / "rank1" / "steps.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (
        not steps.is_file() or steps.read_bytes().count(b"\n") < 3
    ):
        assert all(node.poll() is None for node in nodes), (
            tmp_path / "killed-node1.log"
        ).read_text(errors="replace")[-2000:]
        time.sleep(0.2)
    # the node of global rank 1 dies
    os.kill(json.loads((steps.parent / "rank.json").read_text())["pid"], signal.SIGKILL)
    _ended(nodes, timeout=120)
    shown = json.loads(run_cli("show", "killed", "--json", cwd=tmp_path).stdout)
    assert (
        shown["layout"]["partial"]
        and not shown["complete"]
        and "1" in shown["layout"]["incomplete"]
    )
    text = " ".join(run_cli("show", "killed", cwd=tmp_path).stdout.split())
    assert "partial" in text and "rank 1 stopped at step" in text


def test_a_recipe_on_two_nodes_takes_the_same_torchrun_options(tmp_path: Path) -> None:
    port, recipe = _free_port(), f"{EXAMPLES / 'ddp.py'}:build"
    nodes = [
        _node(tmp_path, "recipe", node, [recipe, "--steps", "3", "--quiet", *_options(node, port)])
        for node in (0, 1)
    ]
    assert _ended(nodes) == [0, 0], (tmp_path / "recipe-node1.log").read_text(errors="replace")[
        -2000:
    ]
    layout = json.loads(run_cli("show", "recipe", "--json", cwd=tmp_path).stdout)["layout"]
    assert (layout["nnodes"], layout["partial"], sorted(n["node"] for n in layout["nodes"])) == (
        2,
        False,
        [0, 1],
    )
