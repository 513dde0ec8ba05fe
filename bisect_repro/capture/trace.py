"""Tracing one training step: every tensor it computes, hashed in execution order.

:class:`StepTracer` hooks a model and its optimizer with PyTorch's public hooks and records, in
the order they happen:

- data: each tensor of the batch;
- forward: every leaf module's (and every module owning parameters) inputs and outputs, except
  an evaluation: a forward under ``torch.no_grad()`` after the step's backward (between the
  update and the next step: it computes nothing the update uses), or one anywhere in the step
  with the module in eval mode (``model.eval()``: a periodic evaluation at the top of the loop).
  A frozen pass in training mode before the backward (pseudo-labels, a teacher's targets) is
  traced;
- backward: the gradient of each such module's outputs as autograd computes it, and each
  parameter's ``.grad`` once accumulated;
- optimizer: every parameter and optimizer-state tensor after each ``optimizer.step()``, of every
  optimizer, in the order they step (in a step that
  calls no optimizer, a loop that updates the weights itself: every parameter as the step leaves
  it); and inside an ``optimizer.step(closure)`` that runs the closure again after a backward
  (LBFGS), every parameter that optimizer holds as the next pass begins: an update made between
  closure passes is the optimizer's, not the forward pass that reads it.

Two traces of the same code line up entry by entry, so the first entry whose hash differs names
the phase, the layer and the tensor where two runs part ways.

:class:`OpTracer` goes one level down, for a single step: a ``TorchDispatchMode`` that hashes the
inputs and outputs of every aten op, and notes its other arguments (a scalar, a size) exactly.
The first op whose inputs, tensors and arguments alike, match and whose output differs is the op
that introduced the difference: a nondeterministic kernel, or one fed by a random stream. Ops
that return uninitialised memory (``empty``, ``empty_like``, ``resize_``, ...) are never compared,
and a tensor they returned counts as equal everywhere until an op writes it.

Where guarantees stop: tensors created outside modules (a loss computed in the step function)
show up only through the gradients and parameters they affect; hooks see what PyTorch's hooks see,
so a module that reuses a tensor in place after returning it is traced as it was at return.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from . import stepping
from .batch import batch_tensors
from .hashing import PendingHashes
from .parallel import local

__all__ = ["OpRecord", "OpTracer", "StepTracer", "TraceEntry", "first_difference"]


@dataclass(frozen=True)
class TraceEntry:
    """One traced tensor: where in the step it was computed, and its content hash."""

    phase: str
    layer: str | None
    tensor: str
    digest: str = ""


def _traced_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    for name, module in model.named_modules():
        if name and (not any(True for _ in module.children()) or module._parameters):
            yield name, module


def _layer_of(parameter_name: str) -> str | None:
    return parameter_name.rpartition(".")[0] or None


@dataclass
class StepTracer:
    """Hooks that hash every tensor a step computes; use as a context manager around the step."""

    model: torch.nn.Module
    optimizers: list[tuple[str, torch.optim.Optimizer]]
    """Each optimizer with the prefix its state is named by (``optimizer``, ``optimizer1``, ...)."""
    parameter_names: dict[int, str]
    keep: set[int] = field(default_factory=set)
    """Entry indices whose tensors are also copied to the host (to measure a difference)."""
    full: bool = True
    """Trace forward and backward too; ``False`` traces only the batch and the state after the
    step."""
    entries: list[TraceEntry] = field(default_factory=list)
    kept: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._pending = PendingHashes()
        self._handles: list[Any] = []
        self._stepped = False
        self._graded = False  # a parameter's gradient was accumulated in this step
        # the optimizer whose step() is running, with its prefix (a closure's passes run inside)
        self._inside: tuple[str, torch.optim.Optimizer] | None = None
        self._graded_inside = False  # a gradient accumulated since that step() or its last pass

    # a hook inside a compiled module: hashed eagerly, never traced. torch.compiler.disable's lazy
    # form: torch._dynamo is imported at the first call, not when a recording imports this module
    @torch._disable_dynamo
    def _note(self, phase: str, layer: str | None, name: str, tensor: torch.Tensor) -> None:
        index = len(self.entries)
        self.entries.append(TraceEntry(phase, layer, name))
        # Hooks fire inside an OpTracer when both run: the hashing itself must stay untraced.
        # a DTensor (FSDP2's parameters and gradients): the shard this rank holds
        tensor = local(tensor)
        with _disable_current_modes():
            self._pending.add({str(index): tensor.detach()})
            if index in self.keep:
                self.kept[index] = tensor.detach().to("cpu", copy=True)

    def note_batch(self, batch: Any, indices: list[int] | None) -> None:
        if indices is not None:
            self._note("data", None, "batch.indices", torch.tensor(indices, dtype=torch.int64))
        tensors, _ = batch_tensors(batch)
        for path, tensor in tensors.items():
            self._note("data", None, path, tensor)

    def note_loss(self, loss: torch.Tensor) -> None:
        """A tensor ``backward()`` is called on: the forward phase's last entry (a loss weighted
        outside any module differs here first)."""
        if self.full:
            self._note("forward", None, "loss", loss)

    def __enter__(self) -> StepTracer:
        if self.full:
            for name, module in _traced_modules(self.model):
                self._handles.append(module.register_forward_hook(self._forward_hook(name)))
            for name, parameter in self.model.named_parameters():
                if parameter.requires_grad:
                    self._handles.append(
                        parameter.register_post_accumulate_grad_hook(self._grad_hook(name))
                    )
        for prefix, optimizer in self.optimizers:
            self._handles.append(optimizer.register_step_pre_hook(self._entered(prefix)))
            self._handles.append(optimizer.register_step_post_hook(self._optimizer_hook(prefix)))
        if self.full:
            for module in (self.model, *self.model.children()):
                self._handles.append(module.register_forward_pre_hook(self._pass_begins))
        current = stepping.running()  # a step that began inside a closure optimizer's step()
        self._inside = next(((p, o) for p, o in self.optimizers if o is current), None)
        return self

    def _entered(self, prefix: str) -> Any:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self._inside, self._graded_inside = (prefix, optimizer), False

        return hook

    def _pass_begins(self, module: torch.nn.Module, args: Any) -> None:
        """A forward pass inside an optimizer's ``step()`` after a backward there (a closure run
        again): the parameters as that optimizer left them between the passes."""
        if self._inside is None or not self._graded_inside:
            return
        self._graded_inside = False
        _, optimizer = self._inside
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                name = self.parameter_names.get(id(parameter), "?")
                self._note("optimizer", _layer_of(name), name, parameter)

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        # no optimizer step: the loop updated the weights itself
        if kind is None and not self._stepped:
            for parameter in self.model.parameters():
                name = self.parameter_names.get(id(parameter), "?")
                self._note("optimizer", _layer_of(name), name, parameter)
        # buffers (running statistics) change in the forward pass, outside any hook
        if kind is None:
            for name, buffer in self.model.named_buffers():
                self._note("optimizer", _layer_of(name), name, buffer)

    def _forward_hook(self, layer: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not torch.is_grad_enabled() and (self._graded or not module.training):
                return  # an evaluation: no part of the update
            inputs, _ = batch_tensors(args, f"{layer}.input")
            for path, tensor in inputs.items():
                self._note("forward", layer, path, tensor)
            outputs, _ = batch_tensors(output, f"{layer}.output")
            for path, tensor in outputs.items():
                self._note("forward", layer, path, tensor)
                if tensor.requires_grad:
                    tensor.register_hook(self._grad_output_hook(layer, path))

        return hook

    def _grad_output_hook(self, layer: str, path: str) -> Any:
        name = path.replace(".output", ".grad_output", 1)

        def hook(grad: torch.Tensor) -> None:
            self._note("backward", layer, name, grad)

        return hook

    def _grad_hook(self, name: str) -> Any:
        def hook(parameter: torch.Tensor) -> None:
            self._graded = True
            self._graded_inside = self._inside is not None
            if parameter.grad is not None:
                self._note("backward", _layer_of(name), f"{name}.grad", parameter.grad)

        return hook

    def _optimizer_hook(self, prefix: str) -> Any:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self._stepped, self._inside = True, None
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    name = self.parameter_names.get(id(parameter), "?")
                    self._note("optimizer", _layer_of(name), name, parameter)
                    for key, value in optimizer.state.get(parameter, {}).items():
                        if isinstance(value, torch.Tensor):
                            self._note(
                                "optimizer", _layer_of(name), f"{prefix}.{name}.{key}", value
                            )

        return hook

    def result(self) -> list[TraceEntry]:
        """The entries with their digests (one host transfer)."""
        digests = list(self._pending.fetch().values())
        return [
            TraceEntry(e.phase, e.layer, e.tensor, d)
            for e, d in zip(self.entries, digests, strict=True)
        ]


def first_difference(a: list[TraceEntry], b: list[TraceEntry]) -> int | None:
    """Index of the first entry that differs in name or content; ``None`` when the traces match."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class OpRecord:
    """One aten op: its name, the module it ran in, its tensors' hashes and its other arguments.

    ``arguments`` is the exact ``repr`` of the non-tensor arguments (a scalar multiplier, a size,
    a flag), so that "equal inputs" means every input, not only the tensors. ``outputs`` is empty
    for ops whose output is uninitialised memory (``empty``, ``new_empty``, ``resize_``, ...):
    their bytes differ by definition and are never compared.
    """

    op: str
    layer: str | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    arguments: str = ""
    phase: str = ""

    def same_inputs(self, other: OpRecord) -> bool:
        """Every input equal: the tensors' contents and the other arguments."""
        return self.inputs == other.inputs and self.arguments == other.arguments


UNINITIALISED = (
    "empty",
    "new_empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "resize_",
    "resize_as_",
    "set_",
)


PARTLY_WRITTEN = ("fsdp.all_gather_copy_in.",)
"""Other ops whose outputs hold memory they did not write: FSDP2's all-gather buffer, which holds
this rank's shard and memory the all-gather writes only later."""


def uninitialised(op: str) -> bool:
    """Whether an op (``aten.empty_like.default``) returns memory it did not write."""
    name = op.removeprefix("aten.").split(".")[0]
    return name in UNINITIALISED or op.startswith(PARTLY_WRITTEN)


def _dense(values: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(values)
    return [
        v
        for v in flat
        if isinstance(v, torch.Tensor) and v.layout == torch.strided and v.device.type != "meta"
    ]


def _wait(output: Any) -> None:
    """A process group's collective writes its outputs asynchronously: wait for it, so that they
    are hashed as written (the caller's own wait then returns at once)."""
    flat, _ = tree_flatten(output)
    for value in flat:
        if isinstance(value, torch.ScriptObject) and hasattr(value, "wait"):
            value.wait()


# a ScriptObject (a process group, a work handle): its repr is an address in one process
_OPAQUE = "<opaque>"


def _arguments(values: Any) -> str:
    flat, _ = tree_flatten(values)
    return repr(
        [
            None
            if isinstance(v, torch.Tensor)
            else _OPAQUE
            if isinstance(v, torch.ScriptObject)
            else v
            for v in flat
        ]
    )


class OpTracer(TorchDispatchMode):
    """Hashes the inputs and outputs of every aten op run under it (meant for a single step)."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self._pending = PendingHashes()
        # op, layer, phase, inputs, outputs, arguments
        self._ops: list[tuple[str, str | None, str, list[str], list[str], str]] = []
        self._layers: list[str] = []
        self._model = model
        self._handles: list[Any] = []
        # outputs of empty*, not yet written
        self._unwritten: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}

    @contextlib.contextmanager
    def tracing(self) -> Iterator[OpTracer]:
        if self._model is not None:
            for name, module in _traced_modules(self._model):
                self._handles.append(module.register_forward_pre_hook(self._enter(name)))
                self._handles.append(module.register_forward_hook(self._leave))
        try:
            with self:
                yield self
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def _enter(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self._layers.append(name)

        return hook

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._layers:
            self._layers.pop()

    def _layer(self) -> str | None:
        """The module the current op runs in (forward only; a subclass may know more)."""
        return self._layers[-1] if self._layers else None

    def _hash(self, tensors: list[torch.Tensor]) -> list[str]:
        keys = []
        for tensor in tensors:
            unwritten = self._unwritten.get(id(tensor))
            if (
                unwritten is not None
                and unwritten[0]() is tensor
                and unwritten[1] == tensor._version
            ):
                keys.append("")  # still uninitialised memory: its bytes mean nothing
                continue
            key = str(len(self._pending))
            self._pending.add({key: local(tensor)})  # a DTensor: its local shard
            keys.append(key)
        return keys

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        inputs = self._hash(_dense((args, kwargs)))
        output = func(*args, **kwargs)
        if name.startswith("c10d."):
            _wait(output)
        if uninitialised(name):
            outputs: list[str] = []
            for tensor in _dense(output):
                self._unwritten[id(tensor)] = (weakref.ref(tensor), tensor._version)
        else:
            written = _dense(output)
            # an in-place op returns what it wrote (its version counter moves only later)
            for tensor in written:
                self._unwritten.pop(id(tensor), None)
            outputs = self._hash(written)
        layer, phase = self._where()
        self._ops.append((name, layer, phase, inputs, outputs, _arguments((args, kwargs))))
        return output

    def _where(self) -> tuple[str | None, str]:
        """The module and phase of the current op (forward only here; a subclass may know more)."""
        layer = self._layer()
        return layer, "forward" if layer is not None else ""

    def result(self) -> list[OpRecord]:
        digests = {**self._pending.fetch(), "": "uninitialised"}
        return [
            OpRecord(
                op,
                layer,
                tuple(digests[k] for k in inputs),
                tuple(digests[k] for k in outputs),
                arguments,
                phase,
            )
            for op, layer, phase, inputs, outputs, arguments in self._ops
        ]


def first_divergent_op(a: list[OpRecord], b: list[OpRecord]) -> tuple[int, bool] | None:
    """The index of the first op whose output differs (or where the sequences part), and whether
    every input of that op, tensors and other arguments, was equal in both."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.op != y.op:
            return index, False
        if x.outputs != y.outputs:
            return index, x.same_inputs(y)
    return None if len(a) == len(b) else (min(len(a), len(b)), False)


def same_sequence(a: list[OpRecord], b: list[OpRecord]) -> bool:
    """Whether two traces ran the same ops in the same order (the same control flow)."""
    return len(a) == len(b) and all(x.op == y.op for x, y in zip(a, b, strict=True))
