"""``doctor``: audit a recipe for every known source of irreproducibility, proving each by a run.

With a TARGET, three experiments run at once:

1. Across processes: the recipe is built and trained for ``steps`` steps in two fresh processes
   (``python -m bisect_repro._doctor_probe``, JSON in and out) that differ in ``PYTHONHASHSEED``.
   Their parameters after the build, their random streams (including generators found inside the
   dataset and samplers), the first batches' sample indices and contents, the losses and the
   state after training are compared: what differs is not seeded (``unseeded-init``,
   ``unseeded-shuffle``, ``unseeded-stream:<name>``, ``unseeded-workers``). A difference no random
   stream explains is settled by two more processes with the same two ``PYTHONHASHSEED`` values:
   each reproducing its namesake, the recipe depends on string hashing (``pythonhashseed``);
   otherwise on some other entropy (``unseeded-source``).
2. In this process: the recipe built once more, each of the first ``steps`` steps run again from
   the same state, batch and random streams. A step that differs from itself runs a nondeterministic
   op; an op-level trace names every op whose inputs match and whose outputs differ, with the
   module it ran in, forward or backward (``nondeterministic-op``). The first step is also run
   under ``torch.use_deterministic_algorithms(True)``, catching each op PyTorch reports as having
   no deterministic implementation (``deterministic-warning``); with one random stream advanced,
   to prove which unseeded streams the step draws from; and on another thread count
   (``threads-unpinned``).
3. The settings the recipe leaves in place: cuDNN autotuning, TF32, the thread count.

Severity: ``error`` makes the recipe irreproducible on this machine, ``warning`` will bite
elsewhere (another GPU, core count or launcher), ``info`` is worth knowing. Without a TARGET,
only the environment and process are audited (never an error).

Where guarantees stop: a nondeterministic kernel may agree with itself by chance in the reruns;
only the first ``steps`` steps are run, so randomness that starts later is not seen; a step that
is already nondeterministic cannot show what another thread count changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import causes, env
from .compare import difference_stats
from .data import loader_generators
from .errors import BisectReproError, RecipeError
from .hashing import hash_tensors
from .recipe import Trainee, recipe_file
from .recorder import batch_tensors, combine_digests
from .replay import Replica, StepStart, StepTrace
from .rng import GLOBAL_STREAMS, RandomSource, RandomStreams
from .trace import OpRecord, OpTracer, first_difference

__all__ = [
    "DEFAULT_STEPS",
    "SCHEMA",
    "ModuleScope",
    "doctor",
    "environment_findings",
    "find_streams",
    "hidden_streams",
    "render_doctor",
    "stream_kind",
]

SCHEMA = "bisect-repro/doctor/1"
DEFAULT_STEPS = 3
SEVERITIES = ("error", "warning", "info")
_RERUNS = 5  # reruns of each step; a nondeterministic kernel may agree with itself by chance
_ATTEMPTS = 6  # traced re-runs to catch a difference already seen once
_HASH_SEEDS = ("1", "2")
_LOADER_STREAMS = ("loader.generator", "sampler.generator", "batch_sampler.generator")
_UNINITIALISED = ("empty", "resize")  # ops whose outputs hold whatever was in memory

Progress = Callable[[str], None]


def _finding(id: str, severity: str, evidence: str, fix: str, layer: str | None = None, op: str | None = None) -> dict[str, Any]:
    return {"id": id, "severity": severity, "layer": layer, "op": op, "evidence": evidence, "fix": fix}


# -- which module an op runs in ----------------------------------------------------------------
_TAG = "bisect_repro.module"


def _tensors(value: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(value)
    return [v for v in flat if isinstance(v, torch.Tensor)]


class ModuleScope:
    """Which module of a model the current op runs in, forward or backward.

    Forward: forward pre- and post-hooks keep a stack of modules. Backward: each module's post-hook
    tags the autograd nodes its forward created (walking back from its outputs to its inputs;
    inner modules tag first), and the node autograd is running names the module.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._stack: list[str] = []
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleScope:
        for name, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter(name)))
            self._handles.append(module.register_forward_hook(self._leave(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()

    def _enter(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self._stack.append(name)

        return hook

    def _leave(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if self._stack:
                self._stack.pop()
            _tag_graph(output, args, name)

        return hook

    def where(self) -> tuple[str, str | None]:
        """``(phase, module)``: phase ``forward``, ``backward`` or ``step`` (outside the model)."""
        if self._stack:
            return "forward", self._stack[-1] or None
        current = getattr(torch._C, "_current_autograd_node", None)
        node = current() if current is not None else None
        if node is not None:
            return "backward", node.metadata.get(_TAG) or None
        return "step", None


def _tag_graph(outputs: Any, inputs: Any, name: str) -> None:
    stop = {id(t.grad_fn): t.grad_fn for t in _tensors(inputs) if t.grad_fn is not None}
    seen: dict[int, Any] = {}  # holds the nodes, so that their ids stay unique during the walk
    pending = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen or id(node) in stop or type(node).__name__ == "AccumulateGrad":
            continue
        seen[id(node)] = node
        node.metadata.setdefault(_TAG, name)
        pending.extend(child for child, _ in node.next_functions)


class _ScopedOps(OpTracer):
    """An op tracer that also knows the module of backward ops, and each op's phase; the ops of
    the phase ``skip`` run untraced (hashing every op's tensors is what costs)."""

    def __init__(self, model: torch.nn.Module, skip: str | None = None) -> None:
        super().__init__(None)
        self.scope = ModuleScope(model)
        self.skip = skip
        self.phases: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        if self.skip is not None and self.scope.where()[0] == self.skip:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    @contextlib.contextmanager
    def tracing(self) -> Iterator[_ScopedOps]:
        with self.scope, super().tracing():
            yield self

    def _layer(self) -> str | None:
        phase, layer = self.scope.where()
        self.phases.append(phase)
        return layer


class _DeterminismAlerts(TorchDispatchMode):
    """Under ``use_deterministic_algorithms(True)``: catches each op that has no deterministic
    kernel (PyTorch raises), notes it with its module, and runs it anyway."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.scope = ModuleScope(model)
        self.alerts: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def catching(self) -> Iterator[_DeterminismAlerts]:
        with self.scope, self:
            yield self

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        except RuntimeError as error:
            if "deterministic" not in str(error):
                raise
            phase, layer = self.scope.where()
            self.alerts.append({"op": str(func), "layer": layer, "phase": phase, "message": str(error).split("\n")[0]})
            torch.use_deterministic_algorithms(False)
            try:
                return func(*args, **kwargs)
            finally:
                torch.use_deterministic_algorithms(True)


# -- random streams hidden in the data ----------------------------------------------------------
_SOURCES = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)
_LEAVES = (str, bytes, int, float, bool, type(None), torch.Tensor, np.ndarray, torch.nn.Module)
_MAX_ITEMS = 32  # of a list or dict looked into: enough for a few augmentations, not a dataset's samples


def stream_kind(source: RandomSource) -> str:
    """``numpy.random.Generator``, ``torch.Generator``, ...: the class as users write it."""
    kind = type(source)
    module = "numpy.random" if kind.__module__.startswith("numpy") else kind.__module__.replace("torch._C", "torch")
    return f"{module}.{kind.__name__}"


def find_streams(loader: Any, *, depth: int = 3, known: Iterable[RandomSource] = ()) -> dict[str, RandomSource]:
    """Random streams held inside a DataLoader's dataset and samplers, by attribute path.

    Looks ``depth`` attributes deep (lists, tuples and dicts count as one level each), so that
    ``loader.dataset.rng``, ``loader.dataset.transforms[0].rng`` or
    ``loader.dataset.dataset.rng`` (a ``Subset``) are found; streams in ``known`` are left out.
    """
    found: dict[str, RandomSource] = {}
    seen = {id(source) for source in known}

    def visit(value: Any, path: str, left: int) -> None:
        if isinstance(value, _SOURCES):
            if id(value) not in seen:
                seen.add(id(value))
                found[path] = value
            return
        if left == 0 or isinstance(value, _LEAVES) or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, Mapping):
            items: Iterable[tuple[str, Any]] = ((f"{path}[{key!r}]", item) for key, item in list(value.items())[:_MAX_ITEMS])
        elif isinstance(value, (list, tuple)):
            items = ((f"{path}[{index}]", item) for index, item in enumerate(value[:_MAX_ITEMS]))
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            items = ((f"{path}.{name}", item) for name, item in vars(value).items() if not name.startswith("__"))
        else:
            return
        for item_path, item in items:
            visit(item, item_path, left - 1)

    for name in ("dataset", "sampler", "batch_sampler"):
        value = getattr(loader, name, None)
        value = getattr(value, "inner", value)  # a DataStream's tap stands in for the sampler
        if value is not None:
            visit(value, f"loader.{name}", depth)
    return found


def hidden_streams(trainee: Trainee) -> dict[str, RandomSource]:
    """The streams inside a trainee's dataset and samplers that its ``TrainingState`` does not know."""
    known = [*loader_generators(trainee.loader).values(), *(trainee.generators or {}).values()]
    return find_streams(trainee.loader, known=known)


# -- the separate processes ---------------------------------------------------------------------
class _Probe:
    """One ``bisect_repro._doctor_probe`` process, started now, read when its result is wanted."""

    def __init__(self, target: str, config: Mapping[str, Any], steps: int, hash_seed: str) -> None:
        package_root = str(Path(__file__).resolve().parent.parent)
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        environment = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": path}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bisect_repro._doctor_probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            text=True,
        )
        spec = json.dumps({"target": target, "config": dict(config), "steps": steps})
        self._output: tuple[str, str] = ("", "")
        self._reader = threading.Thread(target=self._read, args=(spec,), daemon=True)
        self._reader.start()

    def _read(self, spec: str) -> None:
        self._output = self._process.communicate(spec)

    def result(self) -> dict[str, Any]:
        self._reader.join()
        stdout, stderr = self._output
        lines = [line for line in stdout.splitlines() if line.strip()]
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        if not isinstance(result, dict):
            last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "no output")
            raise BisectReproError(f"doctor: the recipe's process exited with code {self._process.returncode} ({last.strip()})")
        if "error" in result:
            raise RecipeError(result["error"])
        return result

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._reader.join(timeout=5)


def _first_batch(a: dict[str, Any], b: dict[str, Any], key: str, *, same_indices: bool = False) -> int | None:
    for index, (x, y) in enumerate(zip(a["batches"], b["batches"], strict=False)):
        if (not same_indices or x["indices"] == y["indices"]) and x[key] != y[key]:
            return index
    return None


def _differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What differs between two probes' results."""

    def names(key: str) -> list[str]:
        return [n for n in a[key] if n in b[key] and a[key][n] != b[key][n]]

    return {
        "init": names("init"),
        "streams": names("streams"),
        "hidden": names("hidden"),
        "order": _first_batch(a, b, "indices"),
        "content": _first_batch(a, b, "content", same_indices=True),
        "base_seed": _first_batch(a, b, "base_seed"),
        "loss": _first_batch(a, b, "loss"),
        "final": names("final"),
    }


def _short(indices: list[int] | None, limit: int = 6) -> str:
    if indices is None:
        return "?"
    shown = ", ".join(map(str, indices[:limit]))
    return f"[{shown}{', ...' if len(indices) > limit else ''}]"


# -- in-process experiments ---------------------------------------------------------------------
def _sources(trainee: Any) -> dict[str, RandomSource]:
    """The recipe's own random streams by name: the loader's, its ``generators``, those in the dataset."""
    return {**loader_generators(trainee.loader), **dict(trainee.generators or {}), **hidden_streams(trainee)}


def _draw(name: str, sources: Mapping[str, RandomSource]) -> None:
    """Advance the stream ``name`` by one draw (global streams: in the current process state)."""
    if name == "python":
        random.random()
    elif name == "numpy":
        np.random.random()
    elif name == "torch":
        torch.rand(())
    elif name.startswith("cuda:"):
        torch.rand((), device=name)
    elif isinstance(source := sources[name], torch.Generator):
        torch.rand((), generator=source, device=source.device)
    elif isinstance(source, np.random.Generator):
        source.random()
    elif isinstance(source, np.random.RandomState):
        source.random_sample()
    else:
        source.random()


def _described(trace: StepTrace, index: int) -> str:
    entry = trace.entries[index]
    where = entry.phase if entry.phase in ("data", "optimizer") else f"{entry.phase} pass"
    return f"{entry.tensor} ({where}{f', layer {entry.layer}' if entry.layer else ''})"


def _stats_text(stats: Mapping[str, Any]) -> str:
    if stats.get("max_abs_diff") is None:
        return ""
    return (
        f": max |a-b| = {stats['max_abs_diff']:.3g}, max ULP distance {stats['max_ulp']}, "
        f"{100 * (stats['fraction_differing'] or 0):.2f}% of elements differ"
    )


class _InProcess:
    """The recipe built in this process, stepped and re-run (experiment 2 of the module docstring).

    Re-runs compare the state after the step (cheap); only a step that differs is traced, tensor
    by tensor and then op by op, to say where.
    """

    def __init__(self, target: str, config: Mapping[str, Any], steps: int) -> None:
        self.replica = Replica.from_recipe(target, config, "doctor")
        if self.replica.trainee.step is None:
            self.replica.close()
            raise RecipeError(f"{target}: the Trainee has no step function; doctor needs step=... to run the recipe")
        self.steps = steps
        self.starts: list[tuple[StepStart, str]] = []
        self.start0: StepStart | None = None
        self.outcome0: str | None = None
        self.nondeterministic_step: int | None = None
        self.findings: list[dict[str, Any]] = []

    def close(self) -> None:
        self.replica.close()

    def _outcome(self, start: StepStart, **options: Any) -> str:
        """A digest of the whole state and the gradients after running the step from ``start``
        (untraced). The gradients keep a difference that the update rounds away (plain SGD)."""
        self.replica.run_step(start, trace=False, **options)
        model = self.replica.trainee.model
        grads = {f"{name}.grad": p.grad for name, p in model.named_parameters() if p.grad is not None}
        return combine_digests(hash_tensors({**self.replica.state.tensors(), **grads}))

    def run_steps(self) -> None:
        """Run the first steps once, keeping the state each starts from and the state it ends in."""
        for _ in range(self.steps):
            start = self.replica.fetch()
            self.starts.append((start, self._outcome(start)))
            self.replica.step = start.step + 1
        self.start0, self.outcome0 = self.starts[0]

    def rerun_steps(self) -> None:
        """Re-run each step from the state it started from; on the first difference, say where.

        Meant to run while nothing else of doctor's runs: a race between threads shows best on
        an otherwise idle machine.
        """
        for _ in range(_RERUNS):
            for start, outcome in self.starts:
                if self._outcome(start) != outcome:
                    self.nondeterministic_step = start.step
                    self.findings += self._locate(start)
                    return

    def _traced_difference(self, start: StepStart, **options: Any) -> tuple[StepTrace, int] | None:
        """Traces of the step as it is and with ``options``, and the first entry that differs."""
        for _ in range(_ATTEMPTS):
            base = self.replica.run_step(start)
            index = first_difference(base.entries, self.replica.run_step(start, **options).entries)
            if index is not None:
                return base, index
        return None

    def _locate(self, start: StepStart) -> list[dict[str, Any]]:
        """Op-level traces of the step, twice, until an op with equal inputs gives different outputs."""
        found = self._traced_difference(start)
        if found is None:
            evidence = f"step {start.step} run twice from the same state, batch and random streams ends in different states"
            return [_finding("nondeterministic-op", "error", evidence, causes.op_fix(None))]
        base, index = found
        ops: list[tuple[str, str | None, str]] = []
        stats: dict[str, Any] = {}
        skip = "backward" if base.entries[index].phase == "forward" else "forward"  # the other pass matched
        for _ in range(_ATTEMPTS):
            model = self.replica.trainee.model
            tracers = (_ScopedOps(model, skip), _ScopedOps(model, skip))
            traces = [self.replica.run_step(start, keep={index}, within=tracer.tracing()) for tracer in tracers]
            if index in traces[0].kept and index in traces[1].kept:
                measured = difference_stats(traces[0].kept[index], traces[1].kept[index])
                stats = measured if measured.get("fraction_differing") else stats
            ops = _divergent_ops(tracers[0].result(), tracers[1].result(), tracers[0].phases)
            if ops:
                break
        first = f"the step first differs at {_described(base, index)}{_stats_text(stats)}"
        entry = base.entries[index]
        if not ops:
            evidence = f"step {start.step} run twice from the same state, batch and random streams gives different results; {first}"
            return [_finding("nondeterministic-op", "error", evidence, causes.op_fix(None), layer=entry.layer)]
        found_ops = []
        for op, layer, phase in ops:
            evidence = (
                f"step {start.step} run twice from the same state, batch and random streams: {op} in the {phase} pass of "
                f"{layer or 'the step function'} gives different outputs on identical inputs; {first}"
            )
            found_ops.append(_finding("nondeterministic-op", "error", evidence, causes.op_fix(op), layer=layer or entry.layer, op=op))
        return found_ops

    def determinism_alerts(self) -> None:
        """Step 0 under ``use_deterministic_algorithms(True)``: the ops PyTorch reports."""
        assert self.start0 is not None
        environment = {
            **self.replica.environment,
            "torch.are_deterministic_algorithms_enabled": True,
            "torch.is_deterministic_algorithms_warn_only_enabled": False,
        }
        alerts = _DeterminismAlerts(self.replica.trainee.model)
        try:
            self.replica.run_step(self.start0, environment=environment, within=alerts.catching(), trace=False)
        except RuntimeError as error:  # raised above the dispatcher, where no op could be caught
            if "deterministic" not in str(error):
                raise
            alerts.alerts.append({"op": None, "layer": None, "phase": "step", "message": str(error).split("\n")[0]})
        by_op: dict[Any, list[dict[str, Any]]] = {}
        for alert in alerts.alerts:
            places = by_op.setdefault(alert["op"], [])
            if all((alert["layer"], alert["phase"]) != (p["layer"], p["phase"]) for p in places):
                places.append(alert)
        for op, places in by_op.items():  # one finding per op: on CUDA without CUBLAS_WORKSPACE_CONFIG every matmul alerts
            shown = [f"the {p['phase']} pass of {p['layer']}" if p["layer"] else f"the {p['phase']}" for p in places[:4]]
            more = f" and {len(places) - 4} more places" if len(places) > 4 else ""
            evidence = (
                f"step 0 under torch.use_deterministic_algorithms(True): PyTorch reports {op or 'an op'} in {', '.join(shown)}"
                f"{more}: {places[0]['message']}"
            )
            fix = causes.alert_fix(op, places[0]["message"])
            self.findings.append(_finding("deterministic-warning", "warning", evidence, fix, layer=places[0]["layer"], op=op))

    def step_changes(self, *, streams: Mapping[str, Any] | None = None, environment: Mapping[str, Any] | None = None) -> str | None:
        """Where step 0 differs when run with other streams or settings (``None``: it does not)."""
        assert self.start0 is not None
        if self._outcome(self.start0, streams=streams, environment=environment) == self.outcome0:
            return None
        found = self._traced_difference(self.start0, streams=streams, environment=environment)
        return _described(*found) if found is not None else "the state after the step"

    def with_stream_advanced(self, name: str) -> str | None:
        """Where step 0 differs when the stream ``name`` starts one draw further."""
        assert self.start0 is not None
        if name not in self.start0.streams:
            return None
        with self.replica.active():
            self.replica.state.streams.load_state_dict(self.start0.streams)
            _draw(name, _sources(self.replica.trainee))
            advanced = self.replica.state.streams.state_dict()[name]
        return self.step_changes(streams={**self.start0.streams, name: advanced})

    def dataset_draws_from(self, name: str, indices: list[int] | None) -> bool | None:
        """Whether the dataset's items at ``indices`` change when the stream ``name`` is one draw
        further (``None``: cannot tell, e.g. not a map-style dataset)."""
        dataset = getattr(self.replica.trainee.loader, "dataset", None)
        sources = _sources(self.replica.trainee)
        if indices is None or not hasattr(dataset, "__getitem__") or (name not in sources and name not in GLOBAL_STREAMS):
            return None
        streams = RandomStreams(sources)

        def contents() -> str:
            tensors, others = batch_tensors([dataset[i] for i in indices])
            return combine_digests([*hash_tensors(tensors).values(), *others])

        with self.replica.active():
            saved = streams.state_dict()
            try:
                before = contents()
                streams.load_state_dict(saved)
                _draw(name, sources)
                return contents() != before
            finally:
                streams.load_state_dict(saved)


def _divergent_ops(a: list[OpRecord], b: list[OpRecord], phases: list[str]) -> list[tuple[str, str | None, str]]:
    """Every op (with its module and phase) whose inputs match and whose outputs differ."""
    found: list[tuple[str, str | None, str]] = []
    for x, y, phase in zip(a, b, phases, strict=False):
        if x.op != y.op:
            break
        if x.inputs == y.inputs and x.outputs != y.outputs and not any(word in x.op for word in _UNINITIALISED):
            key = (x.op, x.layer, phase)
            if key not in found:
                found.append(key)
    return found


# -- the environment ----------------------------------------------------------------------------
def environment_findings(
    fingerprint: Mapping[str, Any], *, threads_pinned: bool, audit: bool, convolutions: bool = True
) -> list[dict[str, Any]]:
    """Findings about settings: those that bite elsewhere, and (``audit``) what the process is."""
    found = []
    cuda = bool(fingerprint.get("devices"))
    here = "" if cuda else "; there is no GPU here, so it changes nothing on this machine"
    if fingerprint.get("torch.backends.cudnn.benchmark"):
        evidence = (
            "torch.backends.cudnn.benchmark is True: cuDNN times several convolution kernels for each new shape and keeps "
            f"the fastest, which can differ from run to run{here}"
        )
        found.append(_finding("cudnn-benchmark", "warning", evidence, causes.environment_fix(["torch.backends.cudnn.benchmark"])))
    matmul, precision = fingerprint.get("torch.backends.cuda.matmul.allow_tf32"), fingerprint.get("torch.get_float32_matmul_precision")
    lowered = [k for k, v in (("torch.backends.cuda.matmul.allow_tf32", matmul),) if v] + (
        ["torch.get_float32_matmul_precision"] if precision not in (None, "highest") else []
    )
    conv = bool(fingerprint.get("torch.backends.cudnn.allow_tf32")) and convolutions
    if lowered or conv:
        parts = []
        if lowered:
            parts.append(
                f"float32 matmuls may run in reduced precision (allow_tf32={matmul}, float32 matmul precision {precision!r}): "
                "on Ampere and later GPUs they keep 10 mantissa bits"
            )
        if conv:
            parts.append("torch.backends.cudnn.allow_tf32 is True (PyTorch's default): convolutions on Ampere and later GPUs use TF32")
        evidence = "; ".join(parts) + f", so results differ across GPU generations and from CPUs{here}"
        keys = [*lowered, *(["torch.backends.cudnn.allow_tf32"] if conv else [])]
        found.append(_finding("tf32", "warning" if lowered else "info", evidence, causes.environment_fix(keys)))
    if not threads_pinned:
        threads = fingerprint.get("torch.get_num_threads")
        evidence = (
            f"torch runs on {threads} threads, chosen from this machine's {fingerprint.get('cpu_count')} cores (OMP_NUM_THREADS unset and "
            "no torch.set_num_threads): on a machine with another core count, reductions split differently and round differently"
        )
        found.append(_finding("threads-unpinned", "warning", evidence, causes.environment_fix(["torch.get_num_threads"])))
    if audit:
        found += _process_audit(fingerprint, cuda)
    return found


def _process_audit(fingerprint: Mapping[str, Any], cuda: bool) -> list[dict[str, Any]]:
    found = []
    if not fingerprint.get("torch.are_deterministic_algorithms_enabled"):
        evidence = (
            "torch.use_deterministic_algorithms is off: ops without a deterministic kernel run as they are (index_put_ with "
            "accumulate=True on several CPU threads, scatter_add_/index_add_ on CUDA, ...); `bisect-repro doctor TARGET` "
            "shows whether a recipe runs any"
        )
        found.append(_finding("deterministic-algorithms", "info", evidence, causes.op_fix(None)))
    if cuda and not fingerprint.get("torch.backends.cudnn.deterministic"):
        evidence = "torch.backends.cudnn.deterministic is False: cuDNN may pick nondeterministic convolution algorithms"
        found.append(_finding("cudnn-deterministic", "info", evidence, causes.environment_fix(["torch.backends.cudnn.deterministic"])))
    if cuda and fingerprint.get("env.CUBLAS_WORKSPACE_CONFIG") is None:
        evidence = "CUBLAS_WORKSPACE_CONFIG is unset: with deterministic algorithms on, cuBLAS matmuls raise (or are nondeterministic)"
        found.append(_finding("cublas-workspace", "info", evidence, causes.environment_fix(["env.CUBLAS_WORKSPACE_CONFIG"])))
    if fingerprint.get("env.PYTHONHASHSEED") in (None, "random"):
        evidence = (
            "PYTHONHASHSEED is unset: str hashes are salted anew in every process, so anything ordered by a set of strings or "
            "by hash() changes between runs; `bisect-repro doctor TARGET` tests whether a recipe depends on it"
        )
        found.append(_finding("pythonhashseed", "info", evidence, causes.environment_fix(["env.PYTHONHASHSEED"])))
    numeric = {k: v for k, v in fingerprint.items() if k.startswith("env.") and v is not None and k != "env.PYTHONHASHSEED"}
    if numeric:
        evidence = "set in this environment, and read by the libraries that compute: " + ", ".join(
            f"{k.removeprefix('env.')}={v}" for k, v in numeric.items()
        )
        found.append(_finding("environment-variables", "info", evidence, "set them the same way wherever runs must match"))
    versions = ", ".join(f"{k} {fingerprint.get(k)}" for k in ("python", "torch", "numpy", "cuda", "cudnn"))
    devices = ", ".join(fingerprint.get("devices") or []) or "none"
    evidence = f"{versions}; GPUs: {devices}; CPU: {fingerprint.get('cpu')}: results may differ when any of these changes"
    fix = "compare runs made with the same versions and hardware (bisect-repro record stores all of these in each run)"
    found.append(_finding("versions", "info", evidence, fix))
    return found


# -- the whole ----------------------------------------------------------------------------------
class _Diagnosis:
    """Turns the probes' differences and the in-process experiments into findings."""

    def __init__(self, a: dict[str, Any], b: dict[str, Any], local: _InProcess, steps: int) -> None:
        self.a, self.b, self.local, self.steps = a, b, local, steps
        self.diff = _differences(a, b)
        self.loader = a.get("loader", {})
        self.findings: list[dict[str, Any]] = []
        self.explained: set[str] = set()  # aspects and streams a finding accounts for
        self.unexplained: list[str] = []

    def _add(self, *findings: dict[str, Any]) -> None:
        self.findings.extend(findings)

    def _digests(self, name: str) -> str:
        return f"{self.a['streams'][name]} vs {self.b['streams'][name]}"

    def run(self) -> list[dict[str, Any]]:
        diff = self.diff
        self._init()
        if diff["order"] is not None:
            self._order(diff["order"])
        elif diff["content"] is not None:
            self._content(diff["content"])
        self._hidden_streams()
        self._streams()
        if diff["final"] and self._started_alike() and "step" not in self.explained:
            self.unexplained.append(f"the state after {self.steps} steps ({diff['final'][0]} first)")
        return self.findings

    def _started_alike(self) -> bool:
        return not self.diff["init"] and self.diff["order"] is None and self.diff["content"] is None

    def _init(self) -> None:
        changed = self.diff["init"]
        if not changed:
            return
        streams = [s for s in self.diff["streams"] if s not in _LOADER_STREAMS]
        if "torch" in streams:  # what torch.nn initialises from; other streams are judged by what draws from them
            streams = ["torch"]
        first = changed[0]
        total = len(self.a["init"])
        what = f"{first} differs between two builds in separate processes ({len(changed)} of {total} parameters and buffers differ)"
        if not streams:
            self.unexplained.append(f"the initial {first}")
            return
        names = ", ".join(f"{s} ({self._digests(s)})" for s in streams)
        evidence = f"{what}; the random streams the initialisation draws from differ after the build: {names}"
        self._add(_finding("unseeded-init", "error", evidence, causes.stream_fix(streams), layer=first.rpartition(".")[0] or None))
        self.explained |= {"init", *streams}

    def _order(self, batch: int) -> None:
        diff, loader = self.diff, self.loader
        indices = (self.a["batches"][batch]["indices"], self.b["batches"][batch]["indices"])
        what = f"batch {batch} holds samples {_short(indices[0])} in one process and {_short(indices[1])} in the other"
        streams = [s for s in diff["streams"] if s in _LOADER_STREAMS]
        if not loader.get("generator") and "torch" in diff["streams"]:
            streams.append("torch")
        hidden = [h for h in diff["hidden"] if not h.startswith("loader.dataset")]
        if hidden:
            for name in hidden:
                kind = self.a["hidden"][name]["kind"]
                evidence = f"{what}; the sampler draws from {name} ({kind}), which starts in a different state in each process"
                self._add(_finding(f"unseeded-stream:{name}", "error", evidence, causes.generator_fix(name, kind)))
            self.explained |= {"order", *hidden}
        elif streams:
            source = (
                "the loader has no generator=, so its sampler shuffles from torch's global stream"
                if streams == ["torch"]
                else f"the sampler shuffles from {', '.join(streams)}"
            )
            evidence = f"{what}; {source}, which is in a different state in each process ({self._digests(streams[0])})"
            self._add(_finding("unseeded-shuffle", "error", evidence, causes.data_fix("data_order", loader)))
            self.explained |= {"order", *streams}
        else:
            self.unexplained.append(f"the samples of batch {batch}")

    def _content(self, batch: int) -> None:
        diff, loader = self.diff, self.loader
        workers = int(loader.get("num_workers") or 0)
        indices = self.a["batches"][batch]["indices"]
        what = f"batch {batch} holds the same samples {_short(indices)} with different contents"
        hidden = [h for h in diff["hidden"] if h.startswith("loader.dataset")]
        candidates = [*hidden, *(s for s in diff["streams"] if s in GLOBAL_STREAMS and not workers)]
        proven = {name: self.local.dataset_draws_from(name, indices) for name in candidates}
        culprits = [name for name, draws in proven.items() if draws] or [name for name in hidden if proven[name] is None]
        for name in culprits:
            shown = f"{name} ({self.a['hidden'][name]['kind']})" if name in self.a["hidden"] else f"{name}'s global stream"
            evidence = f"{what}; the dataset draws from {shown}, which starts in a different state in each process"
            if proven[name]:
                evidence += "; shown here: with it one draw further, the same samples come out different"
            fix = (
                causes.generator_fix(name, self.a["hidden"][name]["kind"], workers=workers)
                if name in self.a["hidden"]
                else causes.stream_fix([name])
            )
            self._add(_finding(f"unseeded-stream:{name}", "error", evidence, fix))
        self.explained |= {"content", *culprits} if culprits else set()
        if culprits:
            return
        if workers and diff["base_seed"] is not None:
            seeds = (self.a["batches"][0]["base_seed"], self.b["batches"][0]["base_seed"])
            source = "the loader's generator" if loader.get("generator") else "torch's global stream (the loader has no generator=)"
            evidence = (
                f"{what}; the {workers} loader workers are seeded from a base seed drawn from {source}, which differs "
                f"({seeds[0]} vs {seeds[1]})"
            )
            self._add(_finding("unseeded-workers", "error", evidence, causes.data_fix("data_content", loader)))
            self.explained |= {"content", "torch", *(s for s in diff["streams"] if s in _LOADER_STREAMS)}
        else:
            self.unexplained.append(f"the contents of batch {batch}")

    def _hidden_streams(self) -> None:
        for name in self.diff["hidden"]:
            if name in self.explained:
                continue
            kind = self.a["hidden"][name]["kind"]
            seen = (
                f"the first {self.steps} batches came out the same"
                if self.diff["order"] is None
                else "the batches already hold other samples, so what it changes is not known"
            )
            evidence = f"{name} ({kind}) starts in a different state in each process; {seen}"
            workers = int(self.loader.get("num_workers") or 0)
            self._add(_finding(f"unseeded-stream:{name}", "warning", evidence, causes.generator_fix(name, kind, workers=workers)))

    def _streams(self) -> None:
        """Unexplained streams: does the step draw from them? Advance each by one draw and see."""
        final_differs = bool(self.diff["final"]) and self._started_alike()
        nondeterministic = self.local.nondeterministic_step is not None
        for name in self.diff["streams"]:
            if name in self.explained:
                continue
            digests = self._digests(name)
            changed = None if nondeterministic else self.local.with_stream_advanced(name)
            if changed is not None or (final_differs and not nondeterministic):
                proof = (
                    f"step 0 draws from it: with it one draw further, {changed} changes"
                    if changed is not None
                    else f"after {self.steps} steps the processes differ ({self.diff['final'][0]} first) though they started alike"
                )
                evidence = f"{name}'s stream is in a different state in each process after the build ({digests}), and {proof}"
                self._add(_finding(f"unseeded-stream:{name}", "error", evidence, causes.stream_fix([name])))
                self.explained |= {"step", name}
            else:
                seen = (
                    "step 0 cannot show whether it draws from it, as the step already differs from itself"
                    if nondeterministic
                    else "step 0 computes the same with it one draw further, so nothing here draws from it yet"
                )
                evidence = (
                    f"{name}'s stream is in a different state in each process after the build ({digests}); {seen}, but "
                    "anything that draws from it later will differ"
                )
                self._add(_finding(f"unseeded-stream:{name}", "info", evidence, causes.stream_fix([name])))
        if nondeterministic:
            self.explained.add("step")


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    diff = _differences(a, b)
    return not diff["init"] and not diff["final"] and all(diff[k] is None for k in ("order", "content", "loss"))


def _hash_seed_findings(
    unexplained: list[str], pair: tuple[dict[str, Any], ...], again: tuple[dict[str, Any], ...]
) -> list[dict[str, Any]]:
    """Two more processes, with the first two's PYTHONHASHSEED values, settle what no stream
    explained: each matches its namesake only if string hashing is the cause (a nondeterministic
    kernel or other entropy would have to repeat both outcomes by chance)."""
    what = ", ".join(unexplained)
    seeds = " vs ".join(_HASH_SEEDS)
    if all(_same(x, y) for x, y in zip(pair, again, strict=True)):
        unset = os.environ.get("PYTHONHASHSEED") in (None, "random")
        evidence = (
            f"{what} differ between two processes whose only difference is PYTHONHASHSEED ({seeds}), and two more processes "
            "with the same two values reproduce each: the recipe depends on string hashing (iteration order of a set or a "
            "dict keyed by str, or hash())"
        )
        if not unset:
            evidence += f"; reproducible here only because PYTHONHASHSEED={os.environ['PYTHONHASHSEED']} is set"
        fix = causes.environment_fix(["env.PYTHONHASHSEED"]) + "; better, sort what the recipe iterates (sorted(set(...)))"
        return [_finding("pythonhashseed", "error" if unset else "warning", evidence, fix)]
    evidence = (
        f"{what} differ between two processes, and again between processes with the same PYTHONHASHSEED, while every random "
        "stream bisect-repro can see matched: the recipe draws from entropy outside them, or runs a nondeterministic kernel "
        "that happened to agree with itself in this process"
    )
    fix = (
        "look for randomness created without a seed outside the loader (np.random.default_rng(), random.Random(), "
        "torch.Generator().seed()) and values from time or os.urandom; run doctor again with more --steps to catch a "
        "rarely nondeterministic kernel"
    )
    return [_finding("unseeded-source", "error", evidence, fix)]


def _threads_finding(findings: list[dict[str, Any]], local: _InProcess) -> None:
    """Prove or weaken the ``threads-unpinned`` warning by running step 0 on another thread count."""
    finding = next((f for f in findings if f["id"] == "threads-unpinned"), None)
    if finding is None:
        return
    threads = int(local.replica.environment.get("torch.get_num_threads") or 1)
    other = 1 if threads > 1 else 2
    if local.nondeterministic_step == 0:
        finding["evidence"] += "; not tested here, as step 0 already differs from itself"
        return
    changed = local.step_changes(environment={**local.replica.environment, "torch.get_num_threads": other})
    if changed is not None:
        finding["evidence"] += f"; shown here: step 0 on {other} thread(s) instead of {threads} computes a different {changed}"
    else:
        finding["severity"] = "info"
        finding["evidence"] += f"; step 0 on {other} thread(s) instead of {threads} computes the same results, so this recipe may not care"


def doctor(
    target: str | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Audit a recipe (or, without a TARGET, this environment); the ``bisect-repro/doctor/1`` object."""
    started = time.perf_counter()
    say = progress or (lambda stage: None)
    config = dict(config or {})
    if target is None:
        if config:
            raise BisectReproError("doctor: --set needs a TARGET to pass the settings to")
        fingerprint = env.fingerprint()
        pinned = fingerprint.get("env.OMP_NUM_THREADS") is not None
        findings = environment_findings(fingerprint, threads_pinned=pinned, audit=True)
    else:
        if steps < 1:
            raise BisectReproError(f"--steps {steps}: must be at least 1")
        path = recipe_file(target)  # checks the TARGET's form
        if path is not None and not path.is_file():
            raise RecipeError(f"{path}: no such recipe file; check the TARGET path")
        findings, fingerprint = _diagnose(target, config, steps, say)
    order = {severity: rank for rank, severity in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f["severity"]])
    return {
        "schema": SCHEMA,
        "reproducible": not any(f["severity"] == "error" for f in findings),
        "findings": findings,
        "target": target,
        "config": config,
        "steps": steps if target is not None else None,
        "seconds": round(time.perf_counter() - started, 3),
        "environment": fingerprint,
    }


def _diagnose(target: str, config: dict[str, Any], steps: int, say: Progress) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    say("building the recipe in two processes and here")
    probes = [_Probe(target, config, steps, seed) for seed in _HASH_SEEDS]
    local: _InProcess | None = None
    try:
        local = _InProcess(target, config, steps)
        say(f"running the first {steps} step(s)")
        local.run_steps()
        say("running step 0 under deterministic algorithms")
        local.determinism_alerts()
        say("waiting for the two processes")
        a, b = (probe.result() for probe in probes)
        say(f"re-running the first {steps} step(s) from the same states")
        local.rerun_steps()
        say("comparing the processes")
        diagnosis = _Diagnosis(a, b, local, steps)
        findings = [*diagnosis.run(), *local.findings]
        if diagnosis.unexplained:
            say("two more processes, to tell string hashing from other entropy")
            more = [_Probe(target, config, steps, seed) for seed in _HASH_SEEDS]
            try:
                findings += _hash_seed_findings(diagnosis.unexplained, (a, b), tuple(probe.result() for probe in more))
            finally:
                for probe in more:
                    probe.stop()
        fingerprint = a["environment"]
        pinned = fingerprint.get("env.OMP_NUM_THREADS") is not None or bool(a["threads_set"])
        convolutions = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in local.replica.trainee.model.modules())
        findings += environment_findings(fingerprint, threads_pinned=pinned, audit=False, convolutions=convolutions)
        _threads_finding(findings, local)
        return findings, fingerprint
    finally:
        for probe in probes:
            probe.stop()
        if local is not None:
            local.close()


# -- the human report ---------------------------------------------------------------------------
_STYLES = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}


def render_doctor(result: Mapping[str, Any], console: Any) -> None:
    """Verdict first, then each finding with its evidence and fix."""
    from rich.panel import Panel

    findings = result["findings"]
    counts = {s: sum(f["severity"] == s for f in findings) for s in SEVERITIES}
    tally = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n) or "no findings"
    subject = result["target"] or "this environment"
    if result["target"] is None:
        headline = f"[bold green]Nothing in this environment alone makes runs irreproducible[/] ({tally})."
    elif result["reproducible"]:
        headline = f"[bold green]Reproducible on this machine[/] ({tally})."
    else:
        headline = f"[bold red]Not reproducible on this machine[/] ({tally})."
    note = f"\n{subject}" + (f", {result['steps']} step(s) checked" if result["target"] else "") + f", {result['seconds']:.1f}s"
    console.print(Panel(headline + note, title="doctor", expand=False))
    for finding in findings:
        where = ", ".join(x for x in (f"layer {finding['layer']}" if finding["layer"] else "", finding["op"] or "") if x)
        style = _STYLES[finding["severity"]]
        console.print(f"\n[{style}]{finding['severity'].upper()}[/] [bold]{finding['id']}[/]" + (f"  ({where})" if where else ""))
        console.print(f"  {finding['evidence']}", highlight=False)
        console.print(f"  [bold green]Fix:[/] {finding['fix']}", highlight=False)
