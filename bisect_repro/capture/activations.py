"""Sketches of a model's activations during one step: where a difference enters, not only where it is felt.

:class:`ActivationSketches` puts a forward hook on every leaf module of a model once, for the
whole recording; between :meth:`~ActivationSketches.start` and :meth:`~ActivationSketches.take`
(one step) the first time each module runs, the first ``SAMPLE`` elements of its output (the first
tensor of it) are copied, and :meth:`~ActivationSketches.take` sketches them
(:mod:`bisect_repro.capture.sketch`, at their flat indices) in the order the modules ran. The
recorder takes them during the step that starts at each snapshot and stores them with the next
snapshot.

The hooks stay in place from the start of the recording to its end and return at once outside
that step, and inside code that ``torch.compile`` traces: a compiled model sees the same hooks at
every step, each one a no-op to the compiler, so it is never compiled again because of them.

Where the guarantees stop: a sample, not the whole output: a difference confined to the elements
after ``SAMPLE`` (later samples of a large batch) is not seen; the output of a module that runs
several times in a step is its first call's; modules inside a compiled region are not seen (their
runs compare by the weights alone); modules whose output is not a floating-point tensor (or a
tuple or list starting with one) are skipped; the sketches of runs with another batch per rank
(another world size) do not compare. A hook costs a Python call per leaf module per forward pass.
"""

from __future__ import annotations

from typing import Any

import torch

from .sketch import PendingSketches, queue_sketches

__all__ = ["SAMPLE", "ActivationSketches"]

SAMPLE = 1 << 14  # elements of each output sketched: the first sample or few of a batch


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


class ActivationSketches:
    """Forward hooks on a model's leaf modules, from :meth:`install` to :meth:`remove`, taking
    samples of the outputs between :meth:`start` and :meth:`take`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handles: list[Any] = []
        self._found: dict[str, torch.Tensor] = {}
        self._active = False

    def install(self) -> ActivationSketches:
        for name, module in self._model.named_modules():
            if name and next(module.children(), None) is None:
                self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def _hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if torch.compiler.is_compiling() or not self._active or name in self._found:
                return
            tensor = _first_tensor(output)
            if tensor is not None:
                self._found[name] = tensor.detach().reshape(-1)[:SAMPLE].clone()  # a later in-place op must not change it

        return hook

    def start(self) -> None:
        """Take the outputs of the modules from now until :meth:`take`."""
        self._found, self._active = {}, True

    def take(self) -> PendingSketches | None:
        """Stop taking; the sketches of the modules in the order they ran, computed where the
        outputs live and not yet fetched (no host synchronisation), or ``None`` when no module ran."""
        found, self._found, self._active = self._found, {}, False
        return queue_sketches(found) if found else None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._active = [], False
