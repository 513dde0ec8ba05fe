"""Compiled against eager, end to end on the CPU (Inductor's C++ backend): a tiny Transformer block
trained eager in run A and under ``torch.compile`` in runs B and C (``compiled_block.py``).

Inductor decomposes ``aten.native_layer_norm`` into its own arithmetic, whose rounding differs from
eager's kernel in the last bits: the runs part at step 0, in the layer norm. The test runs
PyTorch's compiler bisector by hand on that step (the recipe built again, its first batch, one
step, the parameters compared with torch.equal) and checks that compare's ``compile_bisect`` names
the same backend, subsystem, application and op. Run by hand on this machine, the bisector found
``aot_eager_decomp_partition``, ``decomposition``, application 0, ``aten.native_layer_norm``; and
recording run B again with ``TORCH_BISECT_MAX=-1`` (no decomposition applied) matched run A, with
``TORCH_BISECT_MAX=0`` it did not. Two compiled runs with the same settings are identical."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch._inductor.compiler_bisector import BisectionResult, CompilerBisector

from bisect_repro.diagnose.compare.verdict import CompareResult
from bisect_repro.report.html import comparison_html
from bisect_repro.report.text import render_comparison

from .test_verdicts import RECIPES, compare, record

pytestmark = pytest.mark.slow
RECIPE = RECIPES / "compiled_block.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("compiled")
    target = f"{RECIPE}:build"
    eager = record(target, root / "a", "--steps", "2")
    return eager, *(
        record(target, root / name, "--steps", "2", "--set", "compile=true") for name in ("b", "c")
    )  # type: ignore[return-value]


def _step_zero(build: Any, compiled: bool, settings: dict[str, Any]) -> list[torch.Tensor]:
    trainee = build(compile=compiled, **settings)
    trainee.step(next(iter(trainee.loader)))
    return [p.detach().clone() for p in trainee.model.parameters()]


def _by_hand(**settings: Any) -> BisectionResult | None:
    """PyTorch's bisector on step 0 of the recipe, judged by the parameters after it."""
    spec = importlib.util.spec_from_file_location("compiled_block_by_hand", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    eager = _step_zero(module.build, False, settings)

    def passes() -> bool:
        torch._dynamo.reset()
        return all(
            torch.equal(x, y)
            for x, y in zip(eager, _step_zero(module.build, True, settings), strict=True)
        )

    assert not passes()  # compiled, the step differs from eager's
    try:
        return CompilerBisector.do_bisect(passes)
    finally:
        torch._dynamo.reset()


def test_compare_bisects_the_compiler_to_the_stage_found_by_hand(
    runs: tuple[Path, Path, Path],
) -> None:
    a, b, _ = runs
    code, report = compare(a, b)
    verdict, found = report["verdict"], report["compile_bisect"]
    assert code == 1 and (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["tensor"],
    ) == (0, "forward", "norm", "norm.output")
    assert verdict["cause"] == "config" and verdict["config_keys"] == ["compile"]
    hand = _by_hand()
    assert hand is not None
    assert (found["backend"], found["subsystem"], found["bisect_number"], found["debug_info"]) == (
        hand.backend,
        hand.subsystem,
        hand.bisect_number,
        hand.debug_info,
    )
    # as found by hand here
    assert (found["backend"], found["subsystem"]) == ("aot_eager_decomp_partition", "decomposition")
    assert (
        "aten.native_layer_norm" in found["debug_info"]
        and found["run"] == "B"
        and found["unavailable"] is None
    )
    assert any("Binary search completed" in line for line in found["printed"])
    assert "TORCH_BISECT_SUBSYSTEM=decomposition TORCH_BISECT_MAX=-1" in found["commands"][1]
    assert "decomposition of aten.native_layer_norm.default" in verdict["fix"]
    assert [e["outcome"] for e in verdict["evidence"] if e["experiment"] == "compile_bisect"] == [
        "differs"
    ]
    result = CompareResult.from_json(report)
    console = Console(file=io.StringIO(), width=200)
    render_comparison(result, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "compiled: compiler bisection of step 0" in text and "subsystem decomposition" in text
    assert "Compiled against eager" in comparison_html(result)


def test_two_compiled_runs_with_the_same_settings_are_identical(
    runs: tuple[Path, Path, Path],
) -> None:
    _, b, c = runs
    code, report = compare(b, c)
    assert code == 0 and report["identical"] and report["compile_bisect"] is None


@pytest.mark.cuda
def test_on_cuda_with_bf16_autocast_compare_finds_the_stage_found_by_hand(tmp_path: Path) -> None:
    target, settings = f"{RECIPE}:build", ("--set", "device=cuda", "--set", "bf16=true")
    a = record(target, tmp_path / "a", "--steps", "2", *settings)
    b = record(target, tmp_path / "b", "--steps", "2", *settings, "--set", "compile=true")
    code, report = compare(a, b)
    found, hand = report["compile_bisect"], _by_hand(device="cuda", bf16=True)
    assert code == 1 and report["verdict"]["step"] == 0 and hand is not None
    assert (found["backend"], found["subsystem"], found["bisect_number"]) == (
        hand.backend,
        hand.subsystem,
        hand.bisect_number,
    )
