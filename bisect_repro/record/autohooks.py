"""Recording a script that knows nothing of bisect-repro: the steps, the model and the data, from torch's own hooks.

``bisect-repro record --out DIR -- python train.py ...`` runs the script unchanged under
:class:`AutoHooks` (see :mod:`bisect_repro.record.script`), and ``compare`` replays it the same
way (:mod:`bisect_repro.replay.bootstrap`), from the start, like a framework's run:

- **the optimizer** is the first ``torch.optim.Optimizer`` the script makes (its constructor is
  wrapped while the hooks are installed); **a step** is one call of its ``step()`` (torch's global
  optimizer step hooks). A script that makes none (it updates the weights itself) is stepped by
  its ``backward()`` calls: the model's first forward after one starts the next step;
- **the model** is the outermost module whose parameters the optimizer holds (with no optimizer:
  whose parameters require gradients), found at its first forward call with gradients enabled;
  its layers are named as usual;
- **the data**: each batch a ``DataLoader`` yields with gradients enabled, with its sample indices
  (its sampler is tapped while it is iterated, as the Recorder does), so that a different order is
  told from different content; and the positional inputs of each of the model's forward calls
  with gradients enabled, so that a loop with no ``DataLoader`` (``get_batch()``), and what the
  loop does to a batch before the model sees it, are covered too (a forward whose inputs are the
  loader's tensors as drawn is not hashed twice). Several forward calls before one
  optimizer step (gradient accumulation) are that step's micro-batches, all hashed in order;
  batches drawn before the model's first forward belong to step 0; forward calls and loader
  batches under ``torch.no_grad()`` (evaluation) are not batches;
- **the random streams**: the global ones (Python, NumPy, torch, each CUDA device), which is where
  a loader without a generator of its own draws;
- **the config**: :attr:`AutoHooks.config`, filled by whoever records the script (the values its
  ``argparse`` parser read, see :mod:`bisect_repro.record.arguments`) before the model's first forward.

The state at step 0 is taken at the model's first forward call, after the first batch was
drawn; the state at step s > 0 right after the optimizer step of step s - 1.

Where the guarantees stop: one optimizer (a second one, a GAN's, is not followed) and one model,
and an optimizer made after the model's first forward is not followed; inputs passed only as
keyword arguments are hashed only when a ``DataLoader`` yields them; a loader's own generator, a
dataset's generators and the script's counters are not captured (the replay runs the script from
its start, so they are reproduced anyway); a batch a loop prefetches from a ``DataLoader`` before
the optimizer step belongs to the step that drew it; the loss is not logged (the script computes
it where no hook sees it). A script that never steps an optimizer records nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

from ..capture.batch import batch_tensors
from ..capture.data import IndexTap, tap_indices, untap_indices
from ..trainee import NoOptimizer, Trainee
from .options import RecordOptions
from .recorder import FrameworkRecorder

__all__ = ["AutoHooks"]


class AutoHooks:
    """The hooks of a recording (or a replay) of an unchanged script; :meth:`install`, then :meth:`close`."""

    def __init__(self, out: Path | str, options: RecordOptions) -> None:
        self.out, self.options = out, options
        self.optimizer: torch.optim.Optimizer | None = None
        self.model: torch.nn.Module | None = None
        self.recorder: FrameworkRecorder | None = None
        self.config: dict[str, Any] = {}
        """The run's config: the script's parsed arguments (:mod:`bisect_repro.record.arguments`), filled as it runs."""
        self._undo: list[Callable[[], None]] = []
        self._backwards = 0  # backward() calls since the step began (a loop with no optimizer)
        self._taps: dict[int, tuple[DataLoader[Any], IndexTap | None]] = {}  # each loader iterated, by id
        self._early: list[tuple[Any, list[int] | None]] = []  # loader batches drawn before the recorder exists
        self._drawn_ids: set[int] = set()  # the tensors of the loader batches this step drew: not hashed again at the forward

    def install(self) -> AutoHooks:
        original = torch.optim.Optimizer.__init__
        backward = torch.autograd.backward
        hooks = self

        def counted(*args: Any, **kwargs: Any) -> Any:  # Tensor.backward calls torch.autograd.backward
            hooks._backwards += 1
            return backward(*args, **kwargs)

        torch.autograd.backward = counted
        self._undo.append(lambda: setattr(torch.autograd, "backward", backward))

        def init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if hooks.optimizer is None and not isinstance(optimizer, NoOptimizer):
                hooks.optimizer = optimizer

        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(torch.optim.Optimizer, "__init__", original))
        iterate = DataLoader.__iter__

        def tapped(loader: DataLoader[Any]) -> Any:
            if id(loader) not in hooks._taps:
                hooks._taps[id(loader)] = (loader, tap_indices(loader))
            tap = hooks._taps[id(loader)][1]
            if tap is not None:
                tap.pending.clear()  # a new pass: what an abandoned one prefetched is not its
            return hooks._drawn(iterate(loader), tap)

        DataLoader.__iter__ = tapped  # type: ignore[method-assign]
        self._undo += [lambda: setattr(DataLoader, "__iter__", iterate), self._untap]
        forward = torch.nn.modules.module.register_module_forward_pre_hook(self._forward)
        stepped = register_optimizer_step_post_hook(self._stepped)
        self._undo += [forward.remove, stepped.remove]
        return self

    def _drawn(self, batches: Any, tap: IndexTap | None) -> Any:
        """The loader's batches, each noted with its sample indices as it is drawn."""
        for batch in batches:
            if torch.is_grad_enabled():
                self._after_backward()
                indices = tap.pop_indices() if tap is not None else None
                if self.recorder is None:
                    self._early.append((batch, indices))
                else:
                    self.recorder.note_batch(batch, indices)
                self._drawn_ids.update(id(t) for t in batch_tensors(batch)[0].values())
            yield batch

    def _untap(self) -> None:
        for loader, tap in self._taps.values():
            if tap is not None:
                untap_indices(loader, tap)
        self._taps.clear()

    def _forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if not torch.is_grad_enabled():
            return
        if self.model is None:
            if self.optimizer is not None:
                held = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
                if not any(id(p) in held for p in module.parameters()):
                    return
            elif not any(p.requires_grad for p in module.parameters()):
                return
            self.model = module  # with no optimizer: the first module with trainable parameters a forward reaches
            trainee = Trainee(module, self.optimizer, ())
            self.recorder = FrameworkRecorder(self.out, trainee, self.options, config=self.config, environment={}, start_step=0, auto=True)
            self._backwards = 0
            self.recorder.begin_step()
            for batch, indices in self._early:
                self.recorder.note_batch(batch, indices)
            self._early.clear()
        elif module is self.model:
            self._after_backward()
        if module is self.model and self.recorder is not None:
            inputs, _ = batch_tensors(list(args))
            if not inputs or any(id(t) not in self._drawn_ids for t in inputs.values()):  # not the loader's batch as drawn
                self.recorder.note_batch(list(args))

    def _after_backward(self) -> None:
        """No optimizer: a batch drawn, or a forward, after a backward starts the next step."""
        if self.optimizer is None and self._backwards and self.recorder is not None:
            self._next_step()

    def _next_step(self) -> None:
        assert self.recorder is not None
        self._backwards = 0
        self._drawn_ids.clear()
        self.recorder.end_step()
        self.recorder.begin_step()

    def _stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer is self.optimizer and self.recorder is not None and self.model is not None:
            self._next_step()

    def close(self, *, failed: bool = False) -> None:
        """Remove the hooks and close the recorder: its final snapshot (a replay ends its process
        here); ``failed``: the script failed, so the run stays incomplete with what it committed."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if self.recorder is None:
            return
        if failed:
            self.recorder.__exit__(RuntimeError, None, None)
        else:
            self._after_backward()  # no optimizer: the last step ended with its backward (and the update after it)
            self.recorder.close()
