"""Sketches of a model's activations during one step: where a difference enters, not only where it
is felt.

:class:`ActivationSketches` puts a forward hook on every leaf module of a model at
:meth:`~ActivationSketches.start` and removes them at :meth:`~ActivationSketches.take` (one
step): the first time each module runs, the first ``SAMPLE`` elements of its output (the first
tensor of it) are copied, and :meth:`~ActivationSketches.take` sketches them
(:mod:`bisect_repro.capture.sketch`, at their flat indices) in the order the modules ran; the
copies on the CPU are sketched when they are fetched (by the recorder, on its writer's thread).
The recorder takes them during the step that starts at each snapshot and stores them with the
next snapshot; where the next step starts at a snapshot too (``every=1``) the hooks stay in place
between the two. On every other step no hook is in place: a module with a forward hook is called
through ``Module.__call__``'s slower path, which cost a small 50-module MLP's training step 10%
(benchmarks/NOTES.md).

Hooks do nothing inside code that ``torch.compile`` traces, and none is put on a module inside a
compiled block (under an ``_orig_mod``), which keeps that block's one graph. A model compiled
whole (the recorder holds the module ``torch.compile`` wraps) is compiled at most twice: first
traced with the hooks in place (step 0's snapshot), its guards check them, so it has one graph
with them and one without, each reused after, never compiled again because of them.

Where the guarantees stop: a sample, not the whole output: a difference confined to the elements
after ``SAMPLE`` (later samples of a large batch) is not seen; the output of a module that runs
several times in a step is its first call's; modules inside a compiled region are not seen (their
runs compare by the weights alone); modules whose output is not a floating-point tensor (or a
tuple or list starting with one) are skipped; the sketches of runs with another batch per rank
(another world size) do not compare. A model compiled whole runs its hooked graph at each
snapshot's step: the same operations, compiled once more (a backend that tunes kernels by timing
may choose other kernels for it).
"""

from __future__ import annotations

from typing import Any

import torch

from .sketch import PendingSketches, queue_sketches

__all__ = ["SAMPLE", "ActivationSketches"]

SAMPLE = 1 << 14  # elements of each output sketched: the first sample or few of a batch
# the module torch.compile wraps: what runs under it is compiled, where a hook does nothing
_COMPILED = "_orig_mod"


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


class ActivationSketches:
    """Samples of a model's leaf modules' outputs, taken by forward hooks that are in place from
    :meth:`start` to :meth:`take` only."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handles: list[Any] = []
        self._found: dict[str, torch.Tensor] = {}

    def _hook(self, name: str) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if name in self._found or torch.compiler.is_compiling():
                return
            tensor = _first_tensor(output)
            if tensor is not None:
                # a later in-place op must not change it
                self._found[name] = tensor.detach().reshape(-1)[:SAMPLE].clone()

        return hook

    def start(self) -> None:
        """Put a hook on each leaf module of the model: take their outputs from now until
        :meth:`take` (hooks left in place by ``take(keep=True)`` start taking anew)."""
        if self._handles:
            self._found = {}
            return
        for name, module in self._model.named_modules():
            if name and next(module.children(), None) is None and _COMPILED not in name.split("."):
                self._handles.append(module.register_forward_hook(self._hook(name)))

    def take(self, keep: bool = False) -> PendingSketches | None:
        """Remove the hooks (``keep``: leave them for the next :meth:`start`, which follows at once,
        rather than take them off and put them back); the sketches of the modules in the order they
        ran, computed where the outputs live and not yet fetched (no host synchronisation), or
        ``None`` when no module ran (or nothing was started)."""
        found = self._found
        if keep:
            self._found = {}
        else:
            self.remove()
        # its own copies: sketched at fetch
        return queue_sketches(found, private=True) if found else None

    def remove(self) -> None:
        """Remove the hooks, if they are in place, and forget what they took."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._found = [], {}
