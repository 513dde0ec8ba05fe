"""Sketches of a model's activations during one step: where a difference enters, not only where it is felt.

:class:`ActivationSketches` puts a forward hook on every leaf module of a model for one step;
the first time each module runs in that step, the first ``SAMPLE`` elements of its output (the
first tensor of it) are sketched (:mod:`bisect_repro.capture.sketch`, at their flat indices), in
the order the modules run. The recorder takes them during the step that starts at each snapshot
and stores them with the next snapshot.

No hooks are put on a model in a process where ``torch.compile`` has been used (``torch._dynamo``
imported): hooks that come and go would make a compiled model compile again at each snapshot,
and past its cache limit run uncompiled, which changes the training. Such runs compare by their
weights alone.

Where the guarantees stop: a sample, not the whole output: a difference confined to the elements
after ``SAMPLE`` (later samples of a large batch) is not seen; the output of a module that runs
several times in a step is its first call's; modules whose output is not a floating-point tensor
(or a tuple or list starting with one) are skipped; the sketches of runs with another batch per
rank (another world size) do not compare.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .sketch import WIDTH, sketch_tensors

__all__ = ["SAMPLE", "ActivationSketches"]

SAMPLE = 1 << 14  # elements of each output sketched: the first sample or few of a batch


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


class ActivationSketches:
    """Forward hooks on a model's leaf modules, from :meth:`install` to :meth:`close`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handles: list[Any] = []
        self._found: dict[str, torch.Tensor] = {}

    def install(self) -> ActivationSketches:
        if "torch._dynamo" in sys.modules:  # torch.compile in use: see the module docstring
            return self
        for name, module in self._model.named_modules():
            if name and next(module.children(), None) is None:
                self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def _hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            if tensor is not None and name not in self._found:
                self._found[name] = tensor.detach().reshape(-1)[:SAMPLE].clone()  # a later in-place op must not change it

        return hook

    def close(self) -> tuple[list[str], torch.Tensor] | None:
        """Remove the hooks; the module names in the order they ran and their sketches
        (float64[n, WIDTH], on the CPU: a host synchronisation), or ``None`` when no module ran."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        found, self._found = self._found, {}
        if not found:
            return None
        names, values = sketch_tensors(found)
        return names, values.reshape(len(names), WIDTH)
