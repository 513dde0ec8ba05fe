"""Runs that can never match bit for bit, end to end through the CLI: one recipe recorded on one
torch thread and on two (rounding only), on two with a planted departure that no exact signal
shows (one layer's output rounded through bfloat16 from a given step on), and on two with the
same departure set by the recipe's config; one training under DDP
on one rank and on two, and under FSDP2 on two, on the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from bisect_repro.cli import app
from bisect_repro.diagnose.compare.verdict import CompareResult
from bisect_repro.report.text import render_comparison
from tests.e2e.cli import run_cli

pytestmark = pytest.mark.slow

# layer 3 rounds its output from its 5th step on (step 4): the weights at step 5 depart
STEPS, PLANTED = 8, 4


def _record(target: str, out: Path, threads: int, *settings: str, **variables: str) -> None:
    """``target`` recorded on ``threads`` torch threads, with the recipe's ``settings``
    (``KEY=VALUE``) and the environment's ``variables``."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), **variables}
    command = [
        sys.executable,
        "-m",
        "bisect_repro.cli",
        "record",
        target,
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--every",
        "1",
    ]
    command.append("--quiet")
    for setting in settings:
        command += ["--set", setting]
    subprocess.run(command, env=environment, check=True, capture_output=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("numerics")
    target = f"{Path(__file__).parents[2] / 'examples' / 'rounding.py'}:build"
    _record(target, folder / "one", 1)
    _record(target, folder / "two", 2)
    _record(target, folder / "planted", 2, ROUNDING_EXAMPLE_BF16_FROM=str(PLANTED))
    return folder


def _numerics(a: Path, b: Path) -> tuple[dict, str]:
    """``compare --json``'s numerics, and the text report of the same result."""
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--json"])
    assert result.exit_code == 1, result.output
    found = json.loads(result.stdout)
    console = Console(record=True, width=400)
    render_comparison(CompareResult.from_json(found), console)
    return found["numerics"], console.export_text()


def test_one_thread_against_two_differs_by_rounding_only(runs: Path) -> None:
    numerics, _ = _numerics(runs / "one", runs / "two")
    assert (
        numerics["rounding_only"] is True
        and numerics["departure"] is None
        and numerics["signals"] == []
    )
    distance = numerics["distance"]
    assert [d["step"] for d in distance] == list(range(STEPS + 1))
    assert distance[0]["relative"] == 0.0 and distance[0]["exact"] == 0.0  # the same initialisation
    # rounding: tiny, never zero once the threads differ
    assert all(0 < d["relative"] < 1e-5 for d in distance[1:])
    envelope = numerics["envelope"]
    assert envelope["method"] == "2 torch threads instead of 1" and envelope["from_step"] == 0
    assert max(p["relative"] for p in envelope["points"]) > 0
    assert "rounding only" in numerics["sentence"]


def test_a_planted_departure_is_found_at_its_step_and_layer(runs: Path) -> None:
    numerics, text = _numerics(runs / "one", runs / "planted")
    # no exact signal shows it
    assert numerics["rounding_only"] is False and numerics["signals"] == []
    departure = numerics["departure"]
    assert departure["step"] == PLANTED + 1 and departure["last_within"] == PLANTED
    assert departure["layer"] == "3" and departure["cause"] == "numerics"
    assert departure["relative"] > 10 * departure["envelope"]
    assert (
        f"until step {PLANTED}" in numerics["sentence"]
        and "layer 3 departs" in numerics["sentence"]
    )
    assert "layer 3 departs" in text


def test_a_setting_under_another_thread_count_departs_at_its_step_and_layer(
    runs: Path, tmp_path: Path
) -> None:
    """Run B sets ``degrade_at`` (layer 3 rounds its output through bfloat16 from that step on)
    and runs on two threads: the envelope is the threads' alone, and the departure beyond it is
    the setting's, at its step and layer (whether or not the thread count moves this machine's
    rounding: the departure comes from the setting)."""
    target = f"{Path(__file__).parents[2] / 'examples' / 'rounding.py'}:build"
    _record(target, tmp_path / "degraded", 2, f"degrade_at={PLANTED}")
    done = run_cli("compare", str(runs / "one"), str(tmp_path / "degraded"), "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    numerics = json.loads(done.stdout)["numerics"]
    assert numerics["rounding_only"] is False and numerics["signals"] == ["config (degrade_at)"]
    assert numerics["envelope"] is not None, numerics["sentence"]
    departure = numerics["departure"]
    assert (departure["departed"], departure["last_within"], departure["step"]) == (
        PLANTED,
        PLANTED,
        PLANTED + 1,
    )
    assert departure["layer"] == "3" and departure["cause"] == "config (degrade_at)"
    assert f"in step {PLANTED} layer 3 departs" in numerics["sentence"]
    assert numerics["sentence"].endswith("cause config (degrade_at)")


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``rounding.py``'s network on the same global batch: DDP on one rank (``ddp1``) and on two
    (``ddp2``), FSDP2 on two (``fsdp2``)."""
    folder = tmp_path_factory.mktemp("replicated")
    recipe = Path(__file__).parents[2] / "examples" / "rounding.py"
    for name, build, ranks in (
        ("ddp1", "build_ddp", "1"),
        ("ddp2", "build_ddp", "2"),
        ("fsdp2", "build_fsdp", "2"),
    ):
        args = [
            "record",
            f"{recipe}:{build}",
            "--out",
            str(folder / name),
            "--nproc-per-node",
            ranks,
            "--steps",
            "4",
            "--every",
            "1",
        ]
        assert CliRunner().invoke(app, [*args, "--quiet"]).exit_code == 0
    return folder


@pytest.mark.extended
def test_ddp_on_one_rank_against_two_on_the_same_global_batch_differs_by_rounding_only(
    replicated: Path,
) -> None:
    numerics, text = _numerics(replicated / "ddp1", replicated / "ddp2")
    assert numerics["rounding_only"] is True and numerics["departure"] is None, numerics["sentence"]
    assert [d["step"] for d in numerics["distance"]] == [0, 1, 2, 3, 4] and numerics["distance"][0][
        "relative"
    ] == 0.0
    assert max(d["relative"] for d in numerics["distance"]) < 1e-5
    assert "rounding only" in text


def test_fsdp2_against_ddp_on_two_ranks_computes_the_same_weights(replicated: Path) -> None:
    """FSDP2's shards, sketched at their global indices, add up to DDP's whole tensors under the
    names the model gives them; on two ranks both halve a sum of two gradients, which no order
    rounds."""
    numerics, text = _numerics(replicated / "ddp2", replicated / "fsdp2")
    assert (
        numerics["rounding_only"] is True
        and numerics["departure"] is None
        and numerics["signals"] == []
    )
    assert [d["step"] for d in numerics["distance"]] == [0, 1, 2, 3, 4]
    assert all(
        d["relative"] == 0.0 and set(d["layers"]) == {"0", "2", "4"} for d in numerics["distance"]
    )
    assert "equal at every snapshot" in numerics["sentence"] and "(fsdp over a 2 mesh)" in text
    # why its hashes differ, in the verdict
    assert "rank 0 holds other tensors in each run (ddp on 2, fsdp on 2)" in text


def test_fsdp2_on_two_ranks_against_ddp_on_one_differs_by_rounding_only(replicated: Path) -> None:
    numerics, text = _numerics(replicated / "ddp1", replicated / "fsdp2")
    assert numerics["rounding_only"] is True and numerics["departure"] is None, numerics["sentence"]
    distance = numerics["distance"]
    # the halves of the batch round apart
    assert distance[0]["relative"] == 0.0 and all(0 < d["relative"] < 1e-5 for d in distance[1:])
    assert set(distance[-1]["layers"]) == {"0", "2", "4"}
    assert numerics["envelope"] is not None and "rounding only" in text


def test_runs_equal_bit_for_bit_until_a_late_step_measure_no_envelope(
    runs: Path, tmp_path: Path
) -> None:
    target = f"{Path(__file__).parents[2] / 'examples' / 'rounding.py'}:build"
    _record(target, tmp_path / "one-planted", 1, ROUNDING_EXAMPLE_BF16_FROM=str(PLANTED))
    result = CliRunner().invoke(
        app, ["compare", str(runs / "one"), str(tmp_path / "one-planted"), "--json", "--no-replay"]
    )
    numerics = json.loads(result.stdout)["numerics"]
    assert numerics["envelope"] is None and numerics["rounding_only"] is False
    assert f"equal bit for bit up to step {PLANTED}" in numerics["sentence"]
    assert [d["relative"] == 0 for d in numerics["distance"]] == [
        s <= PLANTED for s in range(STEPS + 1)
    ]


def test_a_script_on_one_thread_against_two_differs_by_rounding_only(tmp_path: Path) -> None:
    """A script recorded unchanged has its envelope measured too: run A's script run again from
    its start under run B's thread count (rounding only whatever the machine: where the thread
    count changes nothing, the runs are equal)."""
    script = Path(__file__).parent / "scripts" / "centred_mlp.py"
    for name, threads in (("one", 1), ("two", 2)):
        command = [sys.executable, "-m", "bisect_repro.cli", "record", "--quiet", "--every", "1"]
        command += ["--out", str(tmp_path / name), "--", sys.executable, str(script)]
        environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    result = CliRunner().invoke(
        app, ["compare", str(tmp_path / "one"), str(tmp_path / "two"), "--json"]
    )
    report = json.loads(result.stdout)
    numerics = report["numerics"]
    assert numerics["rounding_only"] is True, numerics["sentence"]
    if not report["identical"]:
        assert numerics["envelope"] is not None, numerics["sentence"]
        assert "replaying run A from step 0" in numerics["sentence"]
