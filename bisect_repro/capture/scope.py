"""Which module of a model an op runs in, forward or backward, and the dispatch modes that ask.

:class:`ModuleScope` answers for the op being dispatched now: forward from a stack kept by
module hooks, backward from a tag its hooks leave on the autograd nodes each module's forward
created (autograd runs nodes, not modules, so the module has to be written onto them). Outside
both (the optimizer, the step function) the phase is ``step`` and there is no module.

Two ``TorchDispatchMode`` s use it, both for ``doctor``: :class:`ScopedOps`, an
:class:`~bisect_repro.capture.trace.OpTracer` that attributes backward ops too and can leave one
pass untraced; and :class:`DeterminismAlerts`, which catches each op that has no deterministic
kernel under ``torch.use_deterministic_algorithms(True)``, notes it and runs it anyway.

Where guarantees stop: the backward side reads ``torch._C._current_autograd_node``, a private
function (where it is missing, backward ops read as phase ``step`` with no module); a node that
two modules' forwards share is named after the first module to tag it, the innermost; the
``AccumulateGrad`` nodes that write ``.grad`` are left untagged, so their ops have no module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.graph import Node
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .trace import OpTracer

__all__ = ["DeterminismAlerts", "ModuleScope", "ScopedOps"]

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
    pending: list[Node | None] = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    while pending:
        node = pending.pop()
        if (
            node is None
            or id(node) in seen
            or id(node) in stop
            or type(node).__name__ == "AccumulateGrad"
        ):
            continue
        seen[id(node)] = node
        node.metadata.setdefault(_TAG, name)  # type: ignore[attr-defined]  # torch declares metadata a method; it is a dict property
        pending.extend(child for child, _ in node.next_functions)


class ScopedOps(OpTracer):
    """An op tracer that also knows the module of backward ops, and each op's phase; the ops of
    the phase ``skip`` run untraced (hashing every op's tensors is what costs)."""

    def __init__(self, model: torch.nn.Module, skip: str | None = None) -> None:
        super().__init__(None)
        self.scope = ModuleScope(model)
        self.skip = skip

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if self.skip is not None and self.scope.where()[0] == self.skip:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    @contextlib.contextmanager
    def tracing(self) -> Iterator[ScopedOps]:
        with self.scope, super().tracing():
            yield self

    def _where(self) -> tuple[str | None, str]:
        phase, layer = self.scope.where()
        return layer, phase


class DeterminismAlerts(TorchDispatchMode):
    """Under ``use_deterministic_algorithms(True)``: catches each op that has no deterministic
    kernel (PyTorch raises), notes it with its module, and runs it anyway."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self.scope = ModuleScope(model)
        self.alerts: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def catching(self) -> Iterator[DeterminismAlerts]:
        with self.scope, self:
            yield self

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        try:
            return func(*args, **kwargs)
        # refused by the deterministic switch, or failed for another reason
        except RuntimeError as error:
            if not torch.are_deterministic_algorithms_enabled():
                raise
            torch.use_deterministic_algorithms(False)
            try:
                result = func(*args, **kwargs)
            except RuntimeError:
                raise error from None  # fails without the switch too: not an alert
            finally:
                torch.use_deterministic_algorithms(True)
            phase, layer = self.scope.where()  # runs only without the switch: the switch refused it
            self.alerts.append(
                {
                    "op": str(func),
                    "layer": layer,
                    "phase": phase,
                    "message": str(error).split("\n")[0],
                }
            )
            return result
