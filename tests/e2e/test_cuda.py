"""The GPU's own causes of irreproducibility, end to end through the CLI on a CUDA device: atomic
adds, cuDNN autotuning, TF32, the GPU's generator reseeded, CPU against GPU, and bf16 autocast.

Each run is recorded in a process of its own (a recipe's global switches, such as
``cudnn.benchmark``, must not leak into the next run) and compared here. Every verdict is printed
(``pytest -s`` shows them), since these tests run only where a GPU is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app

pytestmark = pytest.mark.cuda

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = ("--steps", "6", "--every", "2", "--checkpoint-every", "2")


def record(out: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    environment = {**os.environ, **(env or {})}
    command = [
        sys.executable,
        "-m",
        "bisect_repro.cli",
        "record",
        "--out",
        str(out),
        "--quiet",
        *args,
    ]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def recipe(
    tmp_path: Path, name: str, example: str, *sets: str, env: dict[str, str] | None = None
) -> Path:
    options = [item for s in sets for item in ("--set", s)]
    return record(tmp_path / name, f"{EXAMPLES / example}:build", *STEPS, *options, env=env)


def compare(a: Path, b: Path, scenario: str) -> tuple[int, dict]:
    code, verdict, _ = compare_all(a, b, scenario)
    return code, verdict


def compare_all(a: Path, b: Path, scenario: str) -> tuple[int, dict, dict]:
    """The exit code, the verdict and the ``numerics`` of ``compare --json``."""
    result = runner.invoke(app, ["compare", str(a), str(b), "--json"])
    assert result.exit_code in (0, 1), result.output
    found = json.loads(result.stdout)
    verdict = found["verdict"] or {}  # none where the runs are identical
    numerics = found.get("numerics") or {}
    print(f"\n{scenario}: exit {result.exit_code}, {json.dumps(verdict)}")
    print(
        f"numerics: {numerics.get('sentence')}; envelope: "
        f"{(numerics.get('envelope') or {}).get('method')}"
    )
    return result.exit_code, verdict, numerics


@pytest.mark.parametrize(
    ("op", "where", "kernel"),
    [
        ("index_add", "forward", "index_add"),
        ("scatter_add", "forward", "scatter_add"),
        ("index_add", "backward", "index_add"),  # the backward of index_select
        ("scatter_add", "backward", "scatter_add"),  # the backward of gather
    ],
)
def test_atomic_adds_are_a_nondeterministic_op_named_and_proven(
    tmp_path: Path, op: str, where: str, kernel: str
) -> None:
    a = recipe(tmp_path, "a", "cuda_atomics.py", f"op={op}", f"where={where}")
    b = recipe(tmp_path, "b", "cuda_atomics.py", f"op={op}", f"where={where}")
    code, verdict, numerics = compare_all(a, b, f"{op} in the {where} pass")
    assert code == 1 and verdict["cause"] == "nondeterministic_op" and verdict["phase"] == where, (
        verdict
    )
    assert kernel in (verdict["op"] or ""), verdict
    assert "torch.use_deterministic_algorithms(True)" in verdict["fix"]
    # A run proven to differ from itself is its own envelope: run A again, nothing changed.
    assert "differs from itself" in ((numerics.get("envelope") or {}).get("method") or ""), numerics


def test_deterministic_algorithms_fix_the_atomic_adds(tmp_path: Path) -> None:
    a = recipe(
        tmp_path, "a", "cuda_atomics.py", "op=index_add", "where=backward", "deterministic=true"
    )
    b = recipe(
        tmp_path, "b", "cuda_atomics.py", "op=index_add", "where=backward", "deterministic=true"
    )
    assert compare(a, b, "index_add with deterministic algorithms")[0] == 0


def test_cudnn_benchmark_switched_on_in_one_run_is_named(tmp_path: Path) -> None:
    a = recipe(tmp_path, "a", "cuda_convnet.py")
    b = recipe(tmp_path, "b", "cuda_convnet.py", "benchmark=true")
    code, verdict = compare(a, b, "cudnn.benchmark off against on")
    # Measured on an H100: the config key is named, but inferred: neither run B under run A's
    # settings nor run B rebuilt with run A's config repeated run A's step 0 in the replay.
    assert code == 1 and verdict["cause"] == "config" and verdict["config_keys"] == ["benchmark"], (
        verdict
    )
    assert verdict["confidence"] == "proven" or "could not prove" in verdict["explanation"], verdict


def test_tf32_turned_off_below_pytorch_by_the_environment_is_named_and_proven(
    tmp_path: Path,
) -> None:
    a = recipe(tmp_path, "a", "cuda_mlp.py", "tf32=true")
    b = recipe(tmp_path, "b", "cuda_mlp.py", "tf32=true", env={"NVIDIA_TF32_OVERRIDE": "0"})
    code, verdict, numerics = compare_all(a, b, "TF32 through NVIDIA_TF32_OVERRIDE")
    assert (
        code == 1
        and verdict["cause"] == "environment"
        and verdict["environment_keys"] == ["env.NVIDIA_TF32_OVERRIDE"]
    ), verdict
    assert (verdict["step"], verdict["phase"], verdict["op"], verdict["confidence"]) == (
        0,
        "forward",
        "aten.addmm.default",
        "proven",
    )
    # TF32 changes rounding only: run A replayed with run B's TF32 settings is the envelope.
    assert (
        numerics["rounding_only"] is True
        and "NVIDIA_TF32_OVERRIDE=0" in numerics["envelope"]["method"]
    ), numerics


def test_tf32_turned_on_by_the_environment_is_named(tmp_path: Path) -> None:
    a = recipe(tmp_path, "a", "cuda_mlp.py")
    b = recipe(tmp_path, "b", "cuda_mlp.py", env={"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"})
    code, verdict, numerics = compare_all(a, b, "TF32 through TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
    # Measured on an H100: named from the records (inferred), with the switches it turns on.
    assert code == 1 and verdict["cause"] == "environment" and verdict["step"] == 0, verdict
    assert "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" in verdict["environment_keys"], verdict
    assert (
        numerics["rounding_only"] is True
        and "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in numerics["envelope"]["method"]
    ), numerics


def test_the_gpu_generator_reseeded_from_entropy_is_named(tmp_path: Path) -> None:
    a = recipe(tmp_path, "a", "cuda_mlp.py", "reseed_at=3")
    b = recipe(tmp_path, "b", "cuda_mlp.py", "reseed_at=3")
    code, verdict = compare(a, b, "torch.cuda.seed() at step 3")
    assert code == 1 and verdict["cause"] == "rng_state" and verdict["rng"] == ["cuda:0"], verdict
    # the reseed comes after step 3's update
    assert verdict["step"] == 4 and verdict["confidence"] == "proven", verdict
    assert verdict["reseeded"] and verdict["reseeded"][0]["call"].startswith("torch.cuda.seed"), (
        verdict
    )


def test_the_same_recipe_on_the_cpu_and_on_the_gpu_is_an_environment_difference(
    tmp_path: Path,
) -> None:
    a = recipe(tmp_path, "a", "cuda_convnet.py")
    b = recipe(tmp_path, "b", "cuda_convnet.py", env={"CUDA_VISIBLE_DEVICES": ""})
    code, verdict, numerics = compare_all(a, b, "GPU against CPU")
    assert (
        code == 1
        and verdict["cause"] == "environment"
        and verdict["step"] == 0
        and verdict["phase"] == "forward"
    ), verdict
    assert (
        verdict["environment_keys"] == ["env.CUDA_VISIBLE_DEVICES"]
        and verdict["confidence"] == "proven"
    ), verdict
    # the first convolution: the runs ran different ops from there on
    assert verdict["tensor"] == "0.output", verdict
    # The same seeded training on two devices differs by rounding only, every snapshot measured.
    assert [p["step"] for p in numerics["distance"]] == [0, 2, 4, 6] and numerics["distance"][-1][
        "relative"
    ] > 0, numerics
    assert numerics["rounding_only"] is True and numerics["envelope"] is not None, numerics


@pytest.mark.parametrize("example", ["cuda_mlp.py", "cuda_convnet.py"])
def test_bf16_autocast_seeded_and_deterministic_is_identical(tmp_path: Path, example: str) -> None:
    a = recipe(tmp_path, "a", example, "autocast=true")
    b = recipe(tmp_path, "b", example, "autocast=true")
    assert compare(a, b, f"bf16 autocast, {example}")[0] == 0


def test_an_unchanged_gpu_script_with_scatter_add_messages(tmp_path: Path) -> None:
    script = str(EXAMPLES / "cuda_gnn_script.py")
    runs = [
        record(
            tmp_path / n,
            "--every",
            "2",
            "--checkpoint-every",
            "2",
            "--",
            sys.executable,
            script,
            "--epochs",
            "6",
        )
        for n in "ab"
    ]
    code, verdict = compare(*runs, "unchanged GNN script")
    assert (
        code == 1
        and verdict["cause"] == "nondeterministic_op"
        and "scatter_add" in (verdict["op"] or "")
    ), verdict


def test_a_recipe_under_torchrun_on_the_gpu_gets_a_gloo_and_nccl_group(tmp_path: Path) -> None:
    """A recipe that starts no process group gets ``cpu:gloo,cuda:nccl`` on a GPU node; seeded
    twice, on one rank, the runs are identical."""
    target = f"{EXAMPLES / 'cuda_convnet.py'}:build"
    a, b = (record(tmp_path / n, target, *STEPS, "--nproc-per-node", "1") for n in "ab")
    distributed = json.loads((a / "run.json").read_text())["distributed"]
    print(f"\ndistributed: {distributed}")
    assert distributed["backend"] == "cpu:gloo,cuda:nccl" and distributed["world_size"] == 1, (
        distributed
    )
    assert compare(a, b, "cuda_convnet under torchrun, one rank, twice")[0] == 0


def test_doctor_proves_the_atomic_adds_nondeterministic(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["doctor", f"{EXAMPLES / 'cuda_atomics.py'}:build", "--steps", "2", "--json"]
    )
    report = json.loads(result.stdout)
    print(
        f"\ndoctor: exit {result.exit_code}, "
        f"{[(f['id'], f['severity'], f['op']) for f in report['findings']]}"
    )
    found = [f for f in report["findings"] if f["id"] == "nondeterministic-op"]
    assert (
        result.exit_code == 1
        and found
        and found[0]["severity"] == "error"
        and "scatter_add" in (found[0]["op"] or "")
    ), report
