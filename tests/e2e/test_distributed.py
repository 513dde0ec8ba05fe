"""Distributed runs end to end through the CLI, on a CPU with gloo and two ranks: ``record
--nproc-per-node 2`` (and the Recorder under a plain ``torchrun``), ``show`` with replica drift,
``compare`` rank by rank, from the records and by replaying every rank under torchrun. Each
recording starts three Python processes that import torch, so recordings are shared between the
tests of this module and the whole module counts as slow."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DDP, FSDP = f"{EXAMPLES / 'ddp.py'}:build", f"{EXAMPLES / 'fsdp.py'}:build"
SCHEDULE = ("--steps", "6", "--every", "2")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``recorded(name, target, *args)``: the run, recorded once for the whole module."""
    root, done = tmp_path_factory.mktemp("distributed"), {}

    def record(name: str, target: str, *args: str, nproc: int = 2) -> Path:
        if name not in done:
            out = root / name
            result = runner.invoke(
                app,
                [
                    "record",
                    target,
                    "--out",
                    str(out),
                    "--quiet",
                    "--nproc-per-node",
                    str(nproc),
                    *SCHEDULE,
                    *args,
                ],
            )
            assert result.exit_code == 0, result.output
            done[name] = out
        return done[name]

    return record


def compare(a: Path, b: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["compare", str(a), str(b), "--json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.extended
def test_two_seeded_ddp_runs_are_identical_rank_by_rank(recorded) -> None:
    a, b = recorded("ddp-a", DDP), recorded("ddp-b", DDP)
    code, result = compare(a, b, "--no-replay")
    assert code == 0 and result["identical"] and result["notes"] == []
    assert [(r["rank"], r["verdict"]) for r in result["ranks"]] == [(0, None), (1, None)]
    code, replayed = compare(a, b)  # identical records: nothing to replay
    assert (
        code == 0
        and replayed["identical"]
        and not replayed["replay"]["performed"]
        and replayed["replay"]["commands"] == []
    )
    shown = json.loads(runner.invoke(app, ["show", str(a), "--json"]).stdout)
    assert (
        shown["distributed"]["world_size"] == 2
        and shown["distributed"]["layout"] == "ddp"
        and shown["complete"]
    )
    assert (
        shown["replicas"]["step"] is None
        and shown["replicas"]["snapshots"] == [0, 2, 4, 6]
        and shown["replicas"]["compared"] == 16
    )
    verified = json.loads(runner.invoke(app, ["show", str(a), "--json", "--verify"]).stdout)[
        "verified"
    ]
    assert verified == 10  # 4 snapshots and 1 checkpoint on each rank
    rank = json.loads((a / "rank1" / "rank.json").read_text())
    assert (
        rank["rank"] == 1
        and rank["replica_group"] == [0, 1]
        and rank["loader"]["sampler"] == "DistributedSampler"
    )


@pytest.mark.extended
def test_one_rank_reseeding_is_found_at_its_step_on_that_rank(recorded) -> None:
    a, b = recorded("ddp-a", DDP), recorded("ddp-reseed", DDP, "--set", "reseed_at=3")
    code, result = compare(a, b, "--no-replay")
    verdict = result["verdict"]
    assert code == 1 and (verdict["step"], verdict["rank"], verdict["cause"], verdict["rng"]) == (
        3,
        1,
        "rng_state",
        ["torch"],
    )
    assert verdict["reseeded"][0]["call"] == "torch.seed()" and verdict["reseeded"][0][
        "where"
    ].startswith(str(EXAMPLES / "ddp.py"))
    human = runner.invoke(app, ["compare", str(a), str(b), "--no-replay"])
    assert "step 3, rank 1" in " ".join(human.stdout.split())


def test_one_rank_reseeding_is_proven_by_replaying_both_runs_on_their_ranks(recorded) -> None:
    a, b = recorded("ddp-a", DDP), recorded("ddp-reseed", DDP, "--set", "reseed_at=3")
    done = runner.invoke(app, ["compare", str(a), str(b), "--json"])
    assert done.exit_code == 1, done.output
    result = json.loads(done.stdout)
    verdict, replay = result["verdict"], result["replay"]
    assert (verdict["step"], verdict["rank"], verdict["phase"]) == (3, 1, "forward")
    # the Dropout of nn.Sequential(Linear, ReLU, Dropout, Linear)
    assert verdict["layer"] == "module.2" and "bernoulli" in verdict["op"]
    assert (verdict["cause"], verdict["rng"], verdict["confidence"]) == (
        "rng_state",
        ["torch"],
        "proven",
    )
    assert verdict["reseeded"][0]["call"] == "torch.seed()" and verdict["reseeded"][0][
        "where"
    ].startswith(str(EXAMPLES / "ddp.py"))
    proof = [e for e in verdict["evidence"] if e["experiment"] == "reseed_fixed"]
    assert [(e["subject"], e["outcome"]) for e in proof] == [("run B", "matches")]
    assert (
        replay["performed"]
        and replay["faithful"]
        and replay["from_step"] == 0
        and replay["replayed_steps"] == 4
    )
    on_ranks = "--nproc-per-node 2 (focus: rank 1)"
    assert replay["commands"] == [
        f"recipe {DDP} {on_ranks}",
        f"recipe {DDP} --set reseed_at=3 {on_ranks}",
    ]
    assert f"replaying run B by running: {replay['commands'][1]}" in done.stderr
    assert not any("replay" in note for note in result["notes"]), result["notes"]
    from_records = [
        (r["rank"], r["verdict"]["step"], r["verdict"]["confidence"]) for r in result["ranks"]
    ]
    # each rank's verdict from its records, kept
    assert from_records == [(0, 3, "inferred"), (1, 3, "inferred")]


def test_a_rank_changing_its_own_weights_makes_the_replicas_drift(recorded) -> None:
    drifted = recorded("ddp-drift", DDP, "--set", "drift_at=3")
    shown = runner.invoke(app, ["show", str(drifted)])
    assert (
        shown.exit_code == 0
        and "part at step 4 (equal up to step 2): module.0.weight on rank 1"
        in " ".join(shown.stdout.split())
    )
    replicas = json.loads(runner.invoke(app, ["show", str(drifted), "--json"]).stdout)["replicas"]
    assert (replicas["step"], replicas["last_equal"], replicas["ranks"]) == (4, 2, [1])
    assert replicas["tensors"] == [{"tensor": "module.0.weight", "ranks": [1], "group": [0, 1]}]


@pytest.mark.extended
def test_fsdp2_shards_are_identical_when_seeded_and_a_planted_difference_is_found(recorded) -> None:
    # checkpoints change nothing
    a, b = recorded("fsdp-a", FSDP), recorded("fsdp-b", FSDP, "--checkpoint-every", "2")
    assert compare(a, b, "--no-replay")[0] == 0 and compare(a, b)[0] == 0
    meta = json.loads((a / "run.json").read_text())
    assert meta["distributed"]["layout"] == "fsdp" and meta["model"]["dtensors"]["0.weight"] == {
        "placements": ["S(0)"],
        "mesh": "0",
    }
    replicas = json.loads(runner.invoke(app, ["show", str(a), "--json"]).stdout)["replicas"]
    # only Adam's step counts: the shards are not replicas
    assert replicas["step"] is None and replicas["compared"] == 4
    planted = recorded("fsdp-reseed", FSDP, "--set", "reseed_at=3", "--set", "reseed_rank=0")
    code, result = compare(a, planted, "--no-replay")
    assert code == 1 and (
        result["verdict"]["step"],
        result["verdict"]["rank"],
        result["verdict"]["rng"],
    ) == (3, 0, ["torch"])
    # both ranks replayed: the local shards restored as DTensors, traced as shards
    code, replayed = compare(a, planted)
    verdict = replayed["verdict"]
    assert (
        code == 1
        and replayed["replay"]["performed"]
        and (verdict["step"], verdict["rank"], verdict["phase"]) == (3, 0, "forward")
    )
    assert (verdict["layer"], verdict["cause"], verdict["confidence"], verdict["rng"]) == (
        "2",
        "rng_state",
        "proven",
        ["torch"],
    )
    # a process group is no argument that differs
    assert not any("Python arguments" in note for note in replayed["notes"])


def test_an_fsdp2_run_resumed_on_both_ranks_equals_an_uninterrupted_one(recorded, tmp_path) -> None:
    shutil.copytree(recorded("fsdp-b", FSDP, "--checkpoint-every", "2"), tmp_path / "r")
    args = [
        "record",
        FSDP,
        "--out",
        str(tmp_path / "r"),
        "--quiet",
        "--nproc-per-node",
        "2",
        *SCHEDULE,
        "--checkpoint-every",
        "2",
    ]
    # killed at different points: they agree on step 2
    for rank, kept in ((0, "checkpoint 2"), (1, "checkpoint 4")):
        index = tmp_path / "r" / f"rank{rank}" / "index.jsonl"
        lines = index.read_text().splitlines(keepends=True)
        last = next(
            i
            for i, line in enumerate(lines)
            if json.loads(line)["kind"] == kept.split()[0]
            and json.loads(line)["step"] == int(kept.split()[1])
        )
        index.write_text("".join(lines[: last + 1]))
    assert runner.invoke(app, [*args, "--resume"]).exit_code == 0
    assert (
        tmp_path
        / "r"
        / "rank1"
        / "superseded"
        / "resume-001"
        / "checkpoints"
        / "step-00000004.st.zst"
    ).exists()
    assert compare(recorded("fsdp-a", FSDP), tmp_path / "r", "--no-replay")[0] == 0


def test_another_world_size_is_compared_by_distance_and_the_common_ranks_from_the_records(
    recorded,
) -> None:
    a, one = recorded("ddp-a", DDP), recorded("ddp-one", DDP, nproc=1)
    code, result = compare(a, one, "--no-replay")
    assert code == 1 and [r["rank"] for r in result["ranks"]] == [0]
    assert (
        "run A ran on 2 ranks (ddp), run B on 1 rank (ddp)" in result["notes"][0]
        and "distance" in result["notes"][0]
    )
    assert result["verdict"]["cause"] == "data_order"  # rank 0 of two saw half the samples
    numerics = result["numerics"]
    assert [d["step"] for d in numerics["distance"]] == [0, 2, 4, 6] and numerics["distance"][0][
        "relative"
    ] == 0.0
    # --no-replay runs nothing
    assert (
        numerics["rounding_only"] is False
        and "no rounding envelope was measured" in numerics["sentence"]
    )


def test_a_rank_that_cannot_start_stops_every_rank_with_its_own_error_in_one_line(tmp_path) -> None:
    (tmp_path / "r").mkdir()
    # rank 0 refuses it; rank 1 stops because rank 0 did
    (tmp_path / "r" / "notes.txt").write_text("not a run")
    result = runner.invoke(
        app,
        [
            "record",
            DDP,
            "--out",
            str(tmp_path / "r"),
            "--quiet",
            "--nproc-per-node",
            "2",
            *SCHEDULE,
        ],
    )
    message = result.stderr.strip()
    assert (
        result.exit_code == 2
        and len(message.splitlines()) == 1
        and "Traceback" not in result.output
    ), result.output
    assert message.startswith(f"error: rank 0: {tmp_path / 'r'}: already exists; pass --force")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["notes.txt"]


def test_the_recorder_under_a_plain_torchrun(tmp_path) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLES / "ddp.py"),
    ]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "c")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(runner.invoke(app, ["show", str(tmp_path / "c"), "--json"]).stdout)
    assert (
        shown["complete"]
        and [r["rank"] for r in shown["ranks"]] == [0, 1]
        and shown["replicas"]["step"] is None
    )
    meta = json.loads((tmp_path / "c" / "run.json").read_text())
    launcher = dict(meta["distributed"]["launcher"])
    run_id = launcher.pop("run_id")  # rank 0's, which every rank copies into its rank.json
    assert meta["launch"]["code"]["kind"] == "script" and launcher == {
        "torchrun": True,
        "nproc_per_node": 2,
        "nnodes": 1,
    }
    assert isinstance(run_id, str) and len(run_id) == 32 and int(run_id, 16) >= 0


@pytest.mark.extended
def test_a_reseed_behind_a_closure_counter_on_one_rank_is_proven_on_that_rank(recorded) -> None:
    target = f"{Path(__file__).resolve().parent / 'recipes' / 'ddp_counter.py'}:build"
    schedule = ("--checkpoint-every", "2")
    a, b = (
        recorded("counter-a", target, *schedule),
        recorded("counter-b", target, *schedule, "--set", "reseed_at=3"),
    )
    code, result = compare(a, b)
    verdict = result["verdict"]
    assert code == 1 and (verdict["step"], verdict["rank"], verdict["cause"], verdict["rng"]) == (
        3,
        1,
        "rng_state",
        ["torch"],
    ), verdict
    assert verdict["confidence"] == "proven" and verdict["reseeded"][0]["call"] == "torch.seed()", (
        verdict
    )
    # the counter restored from the checkpoint at step 2
    assert result["replay"]["from_step"] == 2, result["replay"]
