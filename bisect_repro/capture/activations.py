"""Sketches of a model's activations during one step: where a difference enters, not only where it
is felt.

:class:`ActivationSketches` hooks the forward of every leaf module of a model from
:meth:`~ActivationSketches.start` to :meth:`~ActivationSketches.take` (one step): the first
time each module runs, the first ``SAMPLE`` elements of its output (the first tensor of it) are
copied, and :meth:`~ActivationSketches.take` sketches them
(:mod:`bisect_repro.capture.sketch`, at their flat indices) in the order the modules ran; the
copies on the CPU are sketched when they are fetched (by the recorder, on its writer's thread).
The recorder takes them during the step that starts at each snapshot and stores them with the
next snapshot; where the next step starts at a snapshot too (``every=1``) the hook stays in place
between the two. On every other step no hook is in place: while a forward hook is, a module is
called through ``Module.__call__``'s slower path, which cost a small 50-module MLP's training
step 10% (benchmarks/NOTES.md).

The hook does nothing inside code that ``torch.compile`` traces, and ignores the modules inside a
compiled block (under an ``_orig_mod``). A model compiled whole is compiled at most twice: first
traced with the hook in place (step 0's snapshot), its guards check the hooks, so it has one
graph with the hook and one without, each reused after.

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

import warnings
from typing import Any

import torch

from .sketch import PendingSketches, queue_sketches

__all__ = ["SAMPLE", "ActivationSketches"]

SAMPLE = 1 << 14  # elements of each output sketched: the first sample or few of a batch
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
# the module torch.compile wraps: what runs under it is compiled, where a hook does nothing
_COMPILED = "_orig_mod"


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) and output.is_floating_point() else None


class ActivationSketches:
    """Samples of a model's leaf modules' outputs, taken by a forward hook that is in place from
    :meth:`start` to :meth:`take` only.

    The hook is torch's global module forward hook, told the model's leaf modules by identity:
    nothing is put on the user's modules, so a model pickles, deep-copies and saves whole as it
    would unrecorded, and a copy of it (an EMA's) is not sampled."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._handle: Any = None
        self._names: dict[int, str] = {}
        self._found: dict[str, torch.Tensor] = {}

    def _hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        name = self._names.get(id(module))
        if name is None or name in self._found or torch.compiler.is_compiling():
            return
        tensor = _first_tensor(output)
        if tensor is not None:
            # a later in-place op must not change it
            self._found[name] = tensor.detach().reshape(-1)[:SAMPLE].clone()

    def start(self) -> None:
        """Put the hook in place: take the leaf modules' outputs from now until :meth:`take` (a
        hook left in place by ``take(keep=True)`` starts taking anew)."""
        if self._handle is not None:
            self._found = {}
            return
        self._names = {
            id(module): name
            for name, module in self._model.named_modules()
            if name and next(module.children(), None) is None and _COMPILED not in name.split(".")
        }
        # torch warns that a global hook also sees the module torch.compile wraps: this one
        # ignores every module but the model's leaves
        warnings.filterwarnings("ignore", message=_COMPILE_WARNING, category=UserWarning)
        self._handle = torch.nn.modules.module.register_module_forward_hook(self._hook)

    def take(self, keep: bool = False) -> PendingSketches | None:
        """Remove the hook (``keep``: leave it for the next :meth:`start`, which follows at once,
        rather than take it off and put it back); the sketches of the modules in the order they
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
        """Remove the hook, if it is in place, and forget what it took."""
        if self._handle is not None:
            self._handle.remove()
        self._handle, self._names, self._found = None, {}, {}
