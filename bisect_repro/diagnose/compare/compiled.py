"""Compiled against eager: the compiler stage that changes the numbers of the divergent step.

Where one run's code compiled its model with ``torch.compile`` and the other's did not (the
replayed processes report the calls, see :mod:`bisect_repro.capture.compiled`), the divergent
step found by the replay is the reproducer PyTorch's compiler bisector needs.
:func:`bisect_compiled` starts a fresh replica of the compiled run at that step and drives
``torch._inductor.compiler_bisector.CompilerBisector.do_bisect`` with it: each trial compiles the
model again under the bisector's state (shared through a private folder) and runs the step, and
passes when the step's light trace (its batch, its loss and every tensor of the state after it)
hashes as the eager run's did in the replay. The bisector walks the backends (``eager``,
``aot_eager``, ``aot_eager_decomp_partition``, its ``_crossref`` variant, ``inductor``), then the
first failing backend's subsystems (passes, decompositions, lowerings, config switches), and
bisects how many applications of a subsystem it takes. The result is a :class:`CompileBisect`:
the backend and subsystem, the application's number and what the bisector printed, the fix
(:data:`FIXES`) and the variables that reproduce it alone.

Where the guarantees stop: the bisector does not bisect Inductor's fusions or code generation
(a difference there ends at ``inductor`` with no subsystem); the eager run must repeat its own
step (the reference is its replay); code that compiles a function on its own, or with a backend
given as a callable, or with a backend the bisector does not walk, is not bisected, and the
verdict says so in one line.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from ...capture.compiled import CompileCall
from ...capture.trace import first_difference
from ...replay.interface import ReplicaFactory, ReplicaLike
from ...replay.launch import LaunchSpec
from ...replay.lockstep import Divergence
from ...replay.ranked import start_replica
from ...replay.replica import ReplicaFailed
from ...serve.protocol import StepResult
from ...store.meta import CodeKind
from ...store.run import Run

__all__ = [
    "FIXES",
    "CompileBisect",
    "bisect_compiled",
    "compile_bisect",
    "compiled_side",
    "fix_for_stage",
]

BACKENDS = (
    "eager",
    "aot_eager",
    "aot_eager_decomp_partition",
    "aot_eager_decomp_partition_crossref",
    "inductor",
)

_OUT = "keep the module that calls it out of the compiled region (torch.compiler.disable)"
_KEEP = "no Inductor switch restores eager numerics; compare compiled runs only with compiled runs"


def _switch(what: str, setting: str, inductor: bool = True) -> str:
    return (
        f"{what} changes the numbers: set {'torch._inductor.config.' if inductor else ''}{setting}"
    )


FIXES: dict[tuple[str, str | None], str] = {
    ("eager", None): (
        "the step differs from the eager run's even when Dynamo alone captures it (backend "
        "'eager'): the difference is most likely "
        "not the compiler's (another setting, or an eager run that does not repeat); if it is "
        f"Dynamo's, {_OUT}"
    ),
    (
        "aot_eager",
        None,
    ): f"AOTAutograd's tracing changes the numbers: compile with backend='eager', or {_OUT}",
    ("aot_eager_decomp_partition", "aot_eager_decomp_partition_cse"): _switch(
        "AOTAutograd's common-subexpression elimination",
        "torch._functorch.config.cse = False",
        inductor=False,
    ),
    (
        "aot_eager_decomp_partition",
        "decomposition",
    ): f"the decomposition of {{detail}} changes the numbers, and {_KEEP}, or {_OUT}",
    (
        "aot_eager_decomp_partition",
        None,
    ): f"AOTAutograd's decompositions or partitioner change the numbers: {_KEEP}",
    (
        "aot_eager_decomp_partition_crossref",
        None,
    ): "checking fake tensors against real ones changes the numbers: report it to PyTorch",
    ("inductor", "pre_grad_passes"): _switch(
        "Inductor's pre-grad pass {detail}", "use_pre_grad_passes = False"
    ),
    ("inductor", "joint_graph_passes"): _switch(
        "Inductor's joint-graph pass {detail}", "use_joint_graph_passes = False"
    ),
    ("inductor", "post_grad_passes"): _switch(
        "Inductor's post-grad pass {detail}", "use_post_grad_passes = False"
    ),
    ("inductor", "inductor_fallback_random"): _switch(
        "Inductor's own random number generation", "fallback_random = True (draws as eager does)"
    ),
    ("inductor", "inductor_emulate_precision_casts"): _switch(
        "Inductor's keeping low-precision intermediates in float32",
        "emulate_precision_casts = True",
    ),
    ("inductor", "inductor_layout_optimization"): _switch(
        "Inductor's layout optimisation", "layout_optimization = False"
    ),
    ("inductor", "inductor_comprehensive_padding"): _switch(
        "Inductor's padding", "comprehensive_padding = False"
    ),
    (
        "inductor",
        "cudagraphs",
    ): "CUDA graphs change the numbers: compile with mode='max-autotune-no-cudagraphs', not "
    "'reduce-overhead'",
    (
        "inductor",
        "lowerings",
    ): f"Inductor's lowering of {{detail}} changes the numbers, and {_KEEP}, or {_OUT}",
    (
        "inductor",
        None,
    ): "Inductor's generated code (its fusions, which the bisector does not bisect) changes the "
    f"numbers: {_KEEP}",
}
"""The fix for a difference the bisector traced to a backend and a subsystem (``None``: the
backend, with no subsystem found); ``{detail}`` is the op or pass the bisector names."""


@dataclass
class CompileBisect:
    """What the compiler bisection of the divergent step found (``unavailable``: why it did not
    run)."""

    run: str
    """The compiled run, ``A`` or ``B``."""
    step: int
    backend: str | None = None
    """The first backend whose step differs from the eager run's (``None``: none did, or not
    run)."""
    subsystem: str | None = None
    bisect_number: int | None = None
    debug_info: str | None = None
    fix: str = ""
    commands: list[str] = field(default_factory=list)
    """Variables and commands that reproduce the finding alone."""
    printed: list[str] = field(default_factory=list)
    """What the bisector printed, line by line."""
    trials: int = 0
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def evidence(self) -> dict[str, str]:
        """The bisection as an experiment of the verdict."""
        outcome = (
            "inconclusive"
            if self.unavailable is not None
            else ("differs" if self.backend else "matches")
        )
        return {
            "experiment": "compile_bisect",
            "subject": f"run {self.run} compiled again",
            "outcome": outcome,
            "detail": self.sentence(),
        }

    def sentence(self) -> str:
        """The finding in one sentence, with the fix."""
        if self.unavailable is not None:
            return f"compiler bisection: {self.unavailable}"
        if self.backend is None:
            return (
                f"compiler bisection: run {self.run}'s step {self.step}, compiled again under each "
                "backend here, matches the eager "
                f"run every time ({self.trials} trials): the compiled code did not change the "
                "numbers when replayed"
            )
        where = f"backend {self.backend}"
        if self.subsystem is not None:
            where += f", subsystem {self.subsystem}"
            if self.bisect_number is not None and self.subsystem in _BISECTED:
                where += (
                    f" (application {self.bisect_number}"
                    + (f": {_detail(self.debug_info)}" if self.debug_info else "")
                    + ")"
                )
        return (
            f"compiler bisection of step {self.step} ({self.trials} trials): the numbers change "
            f"at {where}; {self.fix}"
        )


_BISECTED = (
    "pre_grad_passes",
    "joint_graph_passes",
    "post_grad_passes",
    "decomposition",
    "lowerings",
    "cudagraphs",
)


def fix_for_stage(backend: str, subsystem: str | None, debug_info: str | None) -> str:
    """The fix for a difference introduced at ``backend``/``subsystem`` (:data:`FIXES`)."""
    template = (
        FIXES.get((backend, subsystem))
        or FIXES.get((backend, None))
        or "report the difference to PyTorch"
    )
    return template.format(detail=_detail(debug_info))


def _detail(debug_info: str | None) -> str:
    """``<OpOverload(op='aten.native_layer_norm', overload='default')>`` as
    ``aten.native_layer_norm.default``."""
    text = debug_info or "the op the bisector names"
    if "op='" in text:
        op = text.split("op='", 1)[1].split("'", 1)[0]
        overload = text.split("overload='", 1)[1].split("'", 1)[0] if "overload='" in text else ""
        return f"{op}.{overload}" if overload else op
    return text


def compiled_side(
    calls: tuple[list[CompileCall], list[CompileCall]],
) -> tuple[int | None, str | None]:
    """Which run compiled (0: A, 1: B) when exactly one did, and why it cannot be bisected
    (``None``: it can)."""
    compiled = [i for i, made in enumerate(calls) if made]
    if len(compiled) != 1:
        return None, None
    side = compiled[0]
    label = "AB"[side]
    for call in calls[side]:
        if call.backend not in BACKENDS:
            return (
                side,
                f"run {label} compiles {call.target} with backend {call.backend!r}, which the "
                "compiler bisector does not walk",
            )
        if not call.replayable:
            return (
                side,
                f"run {label} compiles {call.target} as {call.why_not}, which cannot be compiled "
                "again in place",
            )
    return side, None


def _commands(
    spec: LaunchSpec, runs: tuple[Run, Run], side: int, result: CompileBisect
) -> list[str]:
    """Variables (read by the compiler bisector) and the commands that record the compiled run
    again under them, and compare it with the eager run."""
    assert result.backend is not None
    out = f"{runs[side].path}.{result.backend}"
    if spec.kind is CodeKind.RECIPE:
        settings = "".join(f" --set {shlex.quote(f'{k}={v}')}" for k, v in spec.config.items())
        record = (
            f"bisect-repro record {spec.target} --out {out} --steps {result.step + 1}{settings}"
        )
    else:
        record = f"bisect-repro record --out {out} -- {spec.describe()}"
    lines = [
        f"TORCH_BISECT_BACKEND={result.backend} {record}  # differs from the eager run at step "
        f"{result.step}"
    ]
    number = result.bisect_number
    if result.subsystem in _BISECTED and number is not None:
        base = f"TORCH_BISECT_BACKEND={result.backend} TORCH_BISECT_SUBSYSTEM={result.subsystem}"
        fewer = f"applications 0 to {number - 1} only" if number > 0 else "none applied"
        lines.append(
            f"{base} TORCH_BISECT_MAX={number - 1} {record}  # matches the eager run: {fewer}"
        )
        lines.append(
            f"{base} TORCH_BISECT_MAX={number} {record}  # differs: application {number} added"
        )
    lines.append(f"bisect-repro compare {runs[1 - side].path} {out}")
    return lines


def bisect_compiled(
    runs: tuple[Run, Run],
    side: int,
    spec: LaunchSpec,
    divergence: Divergence,
    checkpoint: int,
    replica: ReplicaLike,
) -> CompileBisect:
    """Run the compiler bisector on the divergent step in ``replica``, a fresh replica of the
    compiled run (``side``); the reference is the other run's light trace of the step."""
    step, run = divergence.step, runs[side]
    reference: StepResult = divergence.light[1 - side]
    result = CompileBisect(run="AB"[side], step=step)
    folder = tempfile.mkdtemp(prefix="bisect-repro-compile-")

    def passes() -> bool:
        result.trials += 1
        trial = replica.run(step, trace="light", compile_bisect=folder)
        index = first_difference(reference.entries, trial.entries)
        if index is not None:  # said among what the bisector prints, where it decided
            entries = trial.entries if index < len(trial.entries) else reference.entries
            print(
                f"trial {result.trials}: step {step} differs from the eager run's at "
                f"{entries[index].tensor}"
            )
        return index is None

    from torch._inductor.compiler_bisector import CompilerBisector

    printed = io.StringIO()
    try:
        replica.connect()
        replica.restore(run.path, checkpoint, run.meta.environment)
        replica.skip(step)
        replica.fetch()
        CompilerBisector.in_process_cache = folder
        with contextlib.redirect_stdout(printed):
            found = CompilerBisector.do_bisect(passes)
    except (ReplicaFailed, RuntimeError) as error:
        result.unavailable = f"the bisection of run {result.run}'s step {step} stopped: {error}"
        return result
    finally:
        CompilerBisector.in_process_cache = None
        shutil.rmtree(folder, ignore_errors=True)
        result.printed = [line for line in printed.getvalue().splitlines() if line.strip()]
    if found is not None:
        result.backend, result.subsystem, result.bisect_number, result.debug_info = (
            found.backend,
            found.subsystem,
            found.bisect_number,
            found.debug_info,
        )
        result.fix = fix_for_stage(found.backend, found.subsystem, found.debug_info)
        result.commands = _commands(spec, runs, side, result)
    return result


def compile_bisect(
    runs: tuple[Run, Run],
    replicas: tuple[ReplicaLike, ReplicaLike],
    specs: tuple[LaunchSpec, LaunchSpec],
    divergence: Divergence,
    checkpoints: tuple[int, int],
    *,
    start: ReplicaFactory = start_replica,
) -> CompileBisect | None:
    """The compiler bisection of the divergent step, where exactly one run compiled (``None``
    otherwise); a fresh replica of the compiled run runs the trials. Which verdicts it runs on is
    their cause's (``compiler_may_explain`` in the cause registry): a step that differs for a
    random stream, the data, hidden state or a nondeterministic op would differ in every trial for
    that reason."""
    try:
        calls = (replicas[0].compiled(), replicas[1].compiled())
    except ReplicaFailed:
        return None
    side, why = compiled_side(calls)
    if side is None:
        return None
    if why is None and not replicas[side].reruns:
        why = (
            f"run {'AB'[side]} is replayed from its own start, one process per step run (a "
            "framework's loop, or a script "
            "recorded unchanged), where a compiled step run again does not yet reproduce it; "
            "record it with the Recorder to bisect it"
        )
    if why is not None:
        return CompileBisect(run="AB"[side], step=divergence.step, unavailable=why)
    with start(
        specs[side], f"run {'AB'[side]}, compiled again by the compiler bisector"
    ) as replica:
        return bisect_compiled(runs, side, specs[side], divergence, checkpoints[side], replica)
