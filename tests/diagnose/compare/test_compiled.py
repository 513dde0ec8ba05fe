"""The compiler bisection of a divergent step, decided against fakes: which run compiled, whether
it can be bisected, the fix for each stage, and PyTorch's real bisector driven through a fake
replica whose "compiler" changes the numbers at one lowering (no compilation runs)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch._inductor.compiler_bisector import CompilerBisector, subsystem_call_counter

from bisect_repro.capture.compiled import CompileCall
from bisect_repro.capture.trace import TraceEntry
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.causes.registry import REGISTRY
from bisect_repro.diagnose.compare.compiled import (
    FIXES,
    CompileBisect,
    bisect_compiled,
    compile_bisect,
    compiled_side,
    fix_for_stage,
)
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.lockstep import Divergence
from bisect_repro.replay.replica import ReplicaFailed
from bisect_repro.serve.protocol import Fetched, StepResult

INDUCTOR = CompileCall("Block", "inductor", "{}", True)
STEP = 3


def _light(digest: str) -> StepResult:
    return StepResult(
        step=STEP,
        entries=[
            TraceEntry("data", None, "batch", "b"),
            TraceEntry("optimizer", "norm", "norm.weight", digest),
        ],
    )


class CompilerReplica:
    """A replica of a compiled run: its step matches the eager run's unless the backend is
    Inductor and its lowering number ``bad`` (of 20) is applied; it asks PyTorch's bisector, in
    this process, which stages to apply, as Inductor does."""

    def __init__(self, bad: int | None = 7, fails: bool = False) -> None:
        self.bad, self.fails, self.calls = bad, fails, [INDUCTOR]
        self.reruns = True
        self.trials: list[str | None] = []

    def compiled(self) -> list[CompileCall]:
        return self.calls

    def connect(self) -> None: ...
    def restore(self, run: Path, step: int, environment: dict[str, Any] | None = None) -> None: ...
    def skip(self, until: int) -> None: ...
    def fetch(self) -> None: ...

    def run(self, step: int, *, trace: str, compile_bisect: str | None = None) -> StepResult:
        assert (
            step == STEP
            and trace == "light"
            and CompilerBisector.in_process_cache == compile_bisect
        )
        if self.fails:
            raise ReplicaFailed("replay of run B stopped during 'run': no C++ compiler")
        subsystem_call_counter.clear()
        backend = CompilerBisector.get_backend()
        self.trials.append(backend)
        differs = False
        if backend == "inductor":
            for number in range(20):
                applied = not CompilerBisector.disable_subsystem(
                    "inductor", "lowerings", lambda n=number: f"aten.op{n}"
                )
                differs = differs or (applied and number == self.bad)
        return _light("compiled" if differs else "eager")

    def __enter__(self) -> CompilerReplica:
        return self

    def __exit__(self, *exc: object) -> None: ...


def _runs() -> Any:
    run = SimpleNamespace(path=Path("runs/b"), meta=SimpleNamespace(environment={}))
    return (SimpleNamespace(path=Path("runs/a"), meta=run.meta), run)


def _divergence() -> Divergence:
    return Divergence(
        step=STEP, fetched=(Fetched(), Fetched()), light=(_light("eager"), _light("compiled"))
    )


SPEC = LaunchSpec(kind="recipe", target="/code/train.py:build", config={"compile": True})


@pytest.mark.parametrize(
    ("calls_a", "calls_b", "side", "why"),
    [
        ([], [], None, None),  # neither compiled: nothing to bisect
        # both compiled: compiled runs compare as any two runs
        ([INDUCTOR], [INDUCTOR], None, None),
        ([], [INDUCTOR], 1, None),
        ([INDUCTOR], [], 0, None),
        (
            [],
            [CompileCall("Block", "tvm", "{}", True)],
            1,
            "run B compiles Block with backend 'tvm', which the compiler bisector does not walk",
        ),
        (
            [],
            [CompileCall("step", "inductor", "{}", False, "a function compiled on its own")],
            1,
            "run B compiles step as a function compiled on its own, which cannot be compiled again "
            "in place",
        ),
    ],
)
def test_which_run_compiled_and_whether_it_can_be_bisected(
    calls_a: list, calls_b: list, side: int | None, why: str | None
) -> None:
    assert compiled_side((calls_a, calls_b)) == (side, why)


def test_each_stage_the_bisector_names_has_a_fix() -> None:
    assert "emulate_precision_casts = True" in fix_for_stage(
        "inductor", "inductor_emulate_precision_casts", None
    )
    assert "fallback_random = True" in fix_for_stage("inductor", "inductor_fallback_random", None)
    assert "torch._functorch.config.cse = False" in fix_for_stage(
        "aot_eager_decomp_partition", "aot_eager_decomp_partition_cse", None
    )
    layer_norm = "<OpOverload(op='aten.native_layer_norm', overload='default')>"
    assert "decomposition of aten.native_layer_norm.default" in fix_for_stage(
        "aot_eager_decomp_partition", "decomposition", layer_norm
    )
    assert fix_for_stage("inductor", "some_new_subsystem", None) == FIXES[("inductor", None)]
    assert "{" not in " ".join(fix_for_stage(b, s, "x") for b, s in FIXES)


def test_the_bisector_finds_the_lowering_that_changes_the_step() -> None:
    replica = CompilerReplica(bad=7)
    found = bisect_compiled(_runs(), 1, SPEC, _divergence(), 0, replica)  # type: ignore[arg-type]
    assert (found.backend, found.subsystem, found.bisect_number, found.debug_info) == (
        "inductor",
        "lowerings",
        7,
        "aten.op7",
    )
    assert found.unavailable is None and found.trials == len(replica.trials)
    assert replica.trials[:5] == [
        "eager",
        "aot_eager",
        "aot_eager_decomp_partition",
        "aot_eager_decomp_partition_crossref",
        "inductor",
    ]
    assert any("The bisect number is 7" in line for line in found.printed)
    assert "lowering of aten.op7" in found.fix and "application 7: aten.op7" in found.sentence()
    assert (
        "TORCH_BISECT_SUBSYSTEM=lowerings TORCH_BISECT_MAX=6 bisect-repro record "
        "/code/train.py:build" in found.commands[1]
    )
    assert found.commands[-1] == "bisect-repro compare runs/a runs/b.inductor"
    assert CompilerBisector.in_process_cache is None and not CompilerBisector.bisection_enabled


def test_a_step_that_matches_under_every_backend_says_so() -> None:
    found = bisect_compiled(_runs(), 1, SPEC, _divergence(), 0, CompilerReplica(bad=None))  # type: ignore[arg-type]
    assert (
        found.backend is None
        and found.trials == 5
        and "matches the eager run every time" in found.sentence()
    )


def test_a_replica_that_cannot_compile_gives_one_line() -> None:
    found = bisect_compiled(_runs(), 1, SPEC, _divergence(), 0, CompilerReplica(fails=True))  # type: ignore[arg-type]
    assert (
        found.backend is None
        and found.unavailable is not None
        and "no C++ compiler" in found.unavailable
    )
    assert found.evidence()["outcome"] == "inconclusive" and "\n" not in found.sentence()


def test_only_a_run_compiled_on_one_side_is_bisected() -> None:
    eager, compiled_ = CompilerReplica(), CompilerReplica()
    eager.calls = []
    started: list[str] = []

    def start(spec: LaunchSpec, label: str) -> CompilerReplica:
        started.append(label)
        return compiled_

    found = compile_bisect(
        _runs(), (eager, compiled_), (SPEC, SPEC), _divergence(), (0, 0), start=start
    )  # type: ignore[arg-type]
    assert isinstance(found, CompileBisect) and found.run == "B" and found.subsystem == "lowerings"
    assert started == ["run B, compiled again by the compiler bisector"]

    def bisected() -> bool:
        return (
            compile_bisect(
                _runs(), (eager, compiled_), (SPEC, SPEC), _divergence(), (0, 0), start=start
            )
            is not None
        )

    # a random stream, the data, hidden state, a nondeterministic op: every trial would differ for
    # that reason
    explained = [c for c in Cause if REGISTRY[c].compiler_may_explain]
    assert explained == [Cause.ENVIRONMENT, Cause.CONFIG, Cause.UNKNOWN]
    compiled_.reruns = False  # a framework's replay, or a script's recorded unchanged
    unsupported = compile_bisect(
        _runs(), (eager, compiled_), (SPEC, SPEC), _divergence(), (0, 0), start=start
    )
    assert (
        unsupported is not None
        and unsupported.backend is None
        and "record it with the Recorder" in (unsupported.unavailable or "")
    )
    eager.calls = [INDUCTOR]
    assert not bisected()
    assert CompileBisect(**found.to_json()) == found
