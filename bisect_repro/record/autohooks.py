"""Recording a script that knows nothing of bisect-repro: the steps, the model and the data, from
torch's own hooks.

``bisect-repro record --out DIR -- python train.py ...`` runs the script unchanged under
:class:`AutoHooks` (see :mod:`bisect_repro.record.script`), and ``compare`` replays it the same
way (:mod:`bisect_repro.replay.bootstrap`), from the start, like a framework's run:

- **the optimizers**: every ``torch.optim.Optimizer`` the script makes before the model's first
  forward (their constructors are wrapped while the hooks are installed); each one's state and
  settings are hashed, saved and restored, the first's named ``optimizer.``, the others'
  ``optimizer1.``, ``optimizer2.``, ... in the order they were made;
- **a step** is what the training computes between two returns of the optimizers' ``step()``
  (torch's global optimizer step hooks): with one optimizer, one call of its ``step()``; with
  several (a GAN's two), it ends when each of them has stepped at least once since it began, so
  that a discriminator stepped five times per generator step makes one step of six updates. Every
  forward and backward pass inside an optimizer's ``step()`` belongs to that step, a closure's
  passes included (LBFGS), and an update made between two closure passes is the step's optimizer
  phase (:mod:`bisect_repro.capture.stepping`). A script that makes no optimizer (it updates the
  weights itself) is stepped by its ``backward()`` calls: the model's first forward after one
  starts the next step;
- **the model** is the outermost module whose parameters the optimizer holds (with no optimizer:
  whose parameters require gradients; where the optimizer holds no module's parameters, the
  module whose forward takes the tensors it trains, an image optimized through a frozen network,
  with those tensors: :func:`~bisect_repro.record.parts.model_of`, and never a batch), found at
  its first forward call with gradients enabled,
  and named as the user's module inside the wrappers that rename it (Lightning Fabric's
  ``_forward_module.``, ``DataParallel``'s ``module.``, ``torch.compile``'s ``_orig_mod.``:
  :class:`~bisect_repro.trainee.Trainee`). With several optimizers over separate modules
  (``netD`` and ``netG``), the model is made of those parts, each the largest module in the
  script's variables (its globals, and the locals of the functions running at that first forward)
  holding an optimizer's parameters, named by its variable (``netD.main.0.weight``; by its class
  where no variable names it), so that a difference names the part and the optimizer;
- **the loss** of a step is the tensor its ``backward()`` is called on; with several calls (a
  GAN's, or gradient accumulation) their sum;
- **the batch** of a step is what its forward consumes: the inputs of each of the model's forward
  calls with gradients enabled, positional and by name (through tuples, lists, mappings and
  dataclasses), whatever made them (a ``DataLoader``, a prefetching wrapper, a Python list,
  ``torch.randint``), the same tensors counted once a step (a closure's passes); and each batch a
  ``DataLoader`` yields with gradients enabled, with its sample indices (its sampler is tapped
  while it is iterated, as the Recorder does), so that a different order is told from different
  content. A loader's batch is held until a forward of the model consumes it (the forward takes
  its tensors, or, where they were moved or transformed first, the oldest batch held), and is
  noted to that step, not the step during which the loader yielded it: a loop that takes batch
  N+1 while step N computes notes batch N+1 to step N+1. Batches drawn before the model's first
  forward belong to step 0; forward calls and loader batches under ``torch.no_grad()``
  (evaluation) are not batches;
- **the random streams**: the global ones (Python, NumPy, torch, each CUDA device), which is where
  a loader without a generator of its own draws;
- **the learning-rate schedulers** the script makes are noted, not recorded: in a replay, a step
  rewound in its process (:mod:`bisect_repro.serve.rewind`) gets them back with the rest of its
  start, and each batch a ``DataLoader`` yields passes through the replay server, which feeds a
  rewound step its kept batches instead of the loader's next ones;
- **a stop**: recorded against a reference run, a run that stops at a difference
  (:mod:`bisect_repro.record.against`) is closed as complete at the start of a step, the hooks
  are removed, and :class:`~bisect_repro.record.against.StopRecording` is raised into the script
  from the hook that began the step (the optimizer's ``step()``, or the forward or the batch
  after a backward), so that it unwinds;
- **the config**: :attr:`AutoHooks.config`, filled by whoever records the script (its command
  line, flag by flag, and the values its ``argparse`` parsers read from it, see
  :mod:`bisect_repro.record.arguments`) before the model's first forward.

The state at step 0 is taken at the model's first forward call, after the first batch was
drawn; the state at step s > 0 right after the optimizer step of step s - 1. So that a run resumed
from another's checkpoint can be audited against the state the other passed through, the streams
are also noted as each snapshot step's first batch is noted, and, at step 0, as the last loader
iterator before the model's first forward is made (before the step drew its data).

Where the guarantees stop: an optimizer made after the model's first forward is not followed (a
one-line note on stderr says so when it is made); an optimizer that never steps, beside others
that do, makes the whole run one step; a loader's batch that no forward takes by its tensors is
taken to be the oldest held, so a loop that skips a batch it drew (and moves the batches it
trains on) notes the skipped one to the next step; a loader's own generator, a dataset's
generators and the script's counters are not captured (the replay runs the script from its start,
so they are reproduced anyway; a rewound step that reads one is caught, and repeated in fresh
processes); the loss is not logged where no ``backward()`` is called on a single number. A script
that never steps an optimizer and never calls ``backward()`` records nothing.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.data import DataLoader

from ..capture import stepping
from ..capture.batch import batch_tensors
from ..capture.data import IndexTap, tap_indices, untap_indices
from ..capture.rng import RandomStreams
from ..trainee import NoOptimizer, Trainee
from .against import Against, StopRecording
from .options import RecordOptions
from .parts import Parts, model_of
from .recorder import FrameworkRecorder

if TYPE_CHECKING:
    from ..serve.rewind import Draw

__all__ = ["AutoHooks", "one_ulp_up"]


def one_ulp_up(model: torch.nn.Module) -> None:
    """Every floating-point parameter moved to the next value up."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point():
                parameter.copy_(torch.nextafter(parameter, torch.full_like(parameter, torch.inf)))


@dataclass
class _Pass:
    """One pass over a loader (an iterator of it), and the batches it drew that no forward of the
    model has consumed yet, oldest first."""

    queue: collections.deque[Draw] = field(default_factory=collections.deque)
    done: bool = False
    """The pass ended (exhausted or abandoned): it is forgotten once its queue is consumed."""

    def position_of(self, ids: set[int]) -> int | None:
        """The held batch whose tensors a forward's inputs include (by identity), if any."""
        for position, (batch, _) in enumerate(self.queue):
            if ids & {id(t) for t in batch_tensors(batch)[0].values()}:
                return position
        return None


class AutoHooks:
    """The hooks of a recording (or a replay) of an unchanged script; :meth:`install`, then
    :meth:`close`."""

    def __init__(
        self,
        out: Path | str,
        options: RecordOptions,
        *,
        start_step: int = 0,
        perturb: bool = False,
        against: Against | None = None,
    ) -> None:
        self.out, self.options, self.against = out, options, against
        # the first step's number: 0, but in a replay of a run seen at another run's steps
        self.start_step = start_step
        # every weight moved one ulp after the first snapshot (a numerics envelope's experiment)
        self.perturb = perturb
        # those made before the model's first forward, in order
        self.optimizers: list[torch.optim.Optimizer] = []
        # the learning-rate schedulers made, in order (a replay's rewind puts them back)
        self.schedulers: list[Any] = []
        self.model: torch.nn.Module | None = None
        # the modules whose forward is the model's (several optimizers: each part)
        self._parts: set[int] = set()
        # the tensors the optimizers train, by id: never a batch, though a forward takes them
        self._trained: set[int] = set()
        self._stepped_now: set[int] = set()  # the optimizers that stepped since the step began
        self._losses: list[torch.Tensor] = []  # what backward() was called on since the step began
        # storage of the parts' outputs this step: a part's input made by another is no batch
        self._made: set[int] = set()
        self.recorder: FrameworkRecorder | None = None
        self.config: dict[str, Any] = {}
        """The run's config: the script's parsed arguments (:mod:`bisect_repro.record.arguments`),
        filled as it runs."""
        self._undo: list[Callable[[], None]] = []
        self._backwards = 0  # backward() calls since the step began (a loop with no optimizer)
        # each loader iterated, by id
        self._taps: dict[int, tuple[DataLoader[Any], IndexTap | None]] = {}
        # each pass over a loader (one iterator) holding batches no forward has consumed yet
        self._passes: list[_Pass] = []
        # the tensors the model's forward took this step (a closure's second pass takes them again)
        self._forward_ids: set[int] = set()
        # the tensors of the loader batches this step drew: not hashed again at the forward
        self._drawn_ids: set[int] = set()
        # the global streams as the last loader iterator before the model's first forward was made
        self._start_streams: dict[str, Any] | None = None

    def install(self) -> AutoHooks:
        original = torch.optim.Optimizer.__init__
        backward = torch.autograd.backward
        hooks = self

        # Tensor.backward calls torch.autograd.backward
        def counted(*args: Any, **kwargs: Any) -> Any:
            hooks._backwards += 1
            hooks._note_loss(
                args[0] if args else kwargs.get("tensors"),
                args[1] if len(args) > 1 else kwargs.get("grad_tensors"),
            )
            return backward(*args, **kwargs)

        torch.autograd.backward = counted
        self._undo.append(lambda: setattr(torch.autograd, "backward", backward))

        def init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            if not isinstance(optimizer, NoOptimizer):
                hooks._made_optimizer(optimizer)

        torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(torch.optim.Optimizer, "__init__", original))
        iterate = DataLoader.__iter__

        def tapped(loader: DataLoader[Any]) -> Any:
            if hooks.model is None and torch.is_grad_enabled():
                hooks._start_streams = RandomStreams().state_dict()
            if id(loader) not in hooks._taps:
                hooks._taps[id(loader)] = (loader, tap_indices(loader))
            tap = hooks._taps[id(loader)][1]
            if tap is not None:
                tap.pending.clear()  # a new pass: what an abandoned one prefetched is not its
            return hooks._drawn(iterate(loader), tap, id(loader))

        DataLoader.__iter__ = tapped  # type: ignore[method-assign]
        self._undo += [lambda: setattr(DataLoader, "__iter__", iterate), self._untap]
        scheduler = torch.optim.lr_scheduler.LRScheduler.__init__

        def made(made_scheduler: Any, *args: Any, **kwargs: Any) -> None:
            scheduler(made_scheduler, *args, **kwargs)
            hooks.schedulers.append(made_scheduler)

        torch.optim.lr_scheduler.LRScheduler.__init__ = made  # type: ignore[method-assign,assignment]
        self._undo.append(
            lambda: setattr(torch.optim.lr_scheduler.LRScheduler, "__init__", scheduler)
        )
        self._undo.append(stepping.track())
        # on every module, never on the model's own: those would be pickled with it
        # (torch.save(model), copy.deepcopy)
        forward = torch.nn.modules.module.register_module_forward_pre_hook(self._forward)
        outputs = torch.nn.modules.module.register_module_forward_hook(
            self._output, with_kwargs=True
        )
        stepped = register_optimizer_step_post_hook(self._stepped)
        self._undo += [forward.remove, outputs.remove, stepped.remove]
        return self

    def _made_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Follow an optimizer made before the model's first forward; note one made later."""
        if self.model is None:
            self.optimizers.append(optimizer)
            return
        made = type(optimizer).__name__
        trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not self.optimizers and not trained & {id(p) for p in self.model.parameters()}:
            # a network run with trainable parameters before any optimizer (a style transfer
            # building its loss targets), then an optimizer of other tensors
            print(
                f"bisect-repro: note: the model was taken at the first forward with trainable "
                f"parameters ({type(self.model).__name__}), made before any optimizer; the "
                f"optimizer made after it ({made}) trains none of its parameters and is not "
                "followed: freeze that network (requires_grad_(False)) or make the optimizer "
                "before its first forward",
                file=sys.stderr,
            )
            return
        print(
            f"bisect-repro: note: an optimizer ({made}) was made after the first step began; it is "
            "not followed (its state is not recorded, and a difference in it shows only through "
            "the model); make it before the training loop",
            file=sys.stderr,
        )

    def _note_loss(self, tensors: Any, gradients: Any) -> None:
        """A ``backward()`` on a single number (no gradient given): part of the step's loss."""
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1 and gradients is None:
            self._losses.append(tensors.detach())
            if self.recorder is not None:
                self.recorder.note_loss(tensors)

    def _log_loss(self) -> None:
        """The step's loss to the recorder: what backward() was called on, summed over its calls."""
        losses, self._losses = self._losses, []
        if not losses or self.recorder is None:
            return
        if len(losses) == 1:
            self.recorder.log(losses[0])
            return
        with _disable_current_modes(), torch.no_grad():  # untraced: this is no op of the step
            self.recorder.log(torch.stack([loss.reshape(()).float() for loss in losses]).sum())

    def _output(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if id(module) not in self._parts or not torch.is_grad_enabled():
            return
        if kwargs and self.recorder is not None and not torch.compiler.is_compiling():
            # inputs given by name (model(**batch)): the torch hook before the forward has none
            named, _ = batch_tensors(dict(kwargs), "kwargs")
            ids = {id(t) for t in named.values()}
            if named and not ids <= self._forward_ids and not ids <= self._drawn_ids:
                self._forward_ids |= ids
                self.recorder.note_batch(dict(kwargs))
        if len(self._parts) > 1:
            outputs, _ = batch_tensors(output)
            self._made.update(
                t.untyped_storage().data_ptr() for t in outputs.values() if t.device.type != "meta"
            )

    def _next(self, batches: Any, tap: IndexTap | None, source: int) -> Draw | None:
        """The loader's next batch with its indices (``None``: exhausted); in a rewound step of a
        replay, the kept one again (:mod:`bisect_repro.serve.rewind`)."""

        def take() -> Draw | None:
            try:
                batch = next(batches)
            except StopIteration:
                return None
            return batch, tap.pop_indices() if tap is not None and torch.is_grad_enabled() else None

        rewinder = self.recorder.rewinder if self.recorder is not None else None
        return take() if rewinder is None else rewinder.draw(source, take)

    def _drawn(self, batches: Any, tap: IndexTap | None, source: int) -> Any:
        """The loader's batches, each held until a forward of the model consumes it
        (:meth:`_consumed`)."""
        this = _Pass()
        self._passes.append(this)
        try:
            while (drawn := self._next(batches, tap, source)) is not None:
                if torch.is_grad_enabled():
                    self._after_backward()
                    this.queue.append(drawn)
                yield drawn[0]
        finally:
            this.done = True
            if not this.queue and this in self._passes:
                self._passes.remove(this)

    def _consumed(self, inputs: dict[str, torch.Tensor]) -> None:
        """A forward of the model consumes a batch: the held batch whose tensors it takes (and those
        drawn before it), else the oldest batch of the latest pass, unless these inputs were seen
        already this step (a closure's passes, a noted batch). Each batch is noted, with its
        sample indices, to the step whose forward consumes it, which is not the step that drew it
        where a loop takes batch N+1 while step N computes."""
        ids = {id(t) for t in inputs.values()}
        taken: tuple[_Pass, int] | None = None
        for this in reversed(self._passes):
            position = this.position_of(ids)
            if position is not None:
                taken = (this, position)
                break
        seen = not ids or ids <= self._forward_ids or bool(ids & self._drawn_ids)
        if taken is None and not seen:
            taken = next(((this, 0) for this in reversed(self._passes) if this.queue), None)
        self._forward_ids |= ids
        if taken is None:
            return
        this, position = taken
        for _ in range(position + 1):
            self._note_drawn(*this.queue.popleft())
        if this.done and not this.queue:
            self._passes.remove(this)

    def _note_drawn(self, batch: Any, indices: list[int] | None) -> None:
        assert self.recorder is not None
        self.recorder.note_batch(batch, indices)
        self._drawn_ids.update(id(t) for t in batch_tensors(batch)[0].values())

    def _untap(self) -> None:
        for loader, tap in self._taps.values():
            if tap is not None:
                untap_indices(loader, tap)
        self._taps.clear()

    def _forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        # Inside a frame torch.compile traces (a compiled model's layers) the model was found
        # already, at the compiled model's own call, which runs outside it.
        if torch.compiler.is_compiling() or not torch.is_grad_enabled():
            return
        if self.model is None:
            trains = self._trains(module, args)
            if trains is None:
                return
            # with no optimizer: the first module with trainable parameters a forward reaches
            self.model = (
                module
                if len(self.optimizers) < 2 and trains == "parameters"
                else model_of(self.optimizers, module, sys._getframe(1))
            )
            parts = list(self.model.children()) if isinstance(self.model, Parts) else [self.model]
            self._parts = {id(m) for m in parts}
            self._trained = self._held()
            trainee = Trainee(self.model, list(self.optimizers) or None, ())
            self.recorder = FrameworkRecorder(
                self.out,
                trainee,
                self.options,
                config=self.config,
                environment={},
                start_step=self.start_step,
                auto=True,
                against=self.against,
            )
            if self.recorder.rewinder is not None:
                # the list itself: one made later is kept too
                self.recorder.rewinder.schedulers = self.schedulers
            self._backwards = 0
            if self._start_streams is not None:
                self.recorder.note_start_streams(self._start_streams)
            self.recorder.begin_step()
            self._stop_if_asked()
            if self.perturb:
                one_ulp_up(self.model)
        elif id(module) in self._parts:
            self._after_backward()
        if id(module) in self._parts and self.recorder is not None:
            self._forward_inputs(list(args))

    def _held(self) -> set[int]:
        """The tensors the optimizers train, by id."""
        return {
            id(p)
            for optimizer in self.optimizers
            for group in optimizer.param_groups
            for p in group["params"]
        }

    def _trains(self, module: torch.nn.Module, args: tuple[Any, ...]) -> str | None:
        """What makes this forward the model's: ``"parameters"``, the module holds parameters the
        optimizers train (with none: parameters that require gradients); ``"inputs"``, it holds
        none of them but takes tensors they train as inputs (an image optimized through a frozen
        network); ``None``: neither, not the model."""
        if not self.optimizers:
            return "parameters" if any(p.requires_grad for p in module.parameters()) else None
        held = self._held()
        if any(id(p) in held for p in module.parameters()):
            return "parameters"
        inputs, _ = batch_tensors(list(args))
        return "inputs" if any(id(t) in held for t in inputs.values()) else None

    def _forward_inputs(self, args: list[Any]) -> None:
        """The inputs of a forward of the model: part of its step's batch, unless another part
        computed them, or the step saw them already (a loader's batch as drawn, or the same
        tensors again: a closure's passes)."""
        assert self.recorder is not None
        inputs, _ = batch_tensors(args)
        ids = {id(t) for t in inputs.values()}
        if inputs and ids <= self._trained:
            # what the optimizers train is the model's state, snapshotted: the step's batch is
            # empty (noted once, so that the step is logged with its loss)
            if not ids <= self._forward_ids:
                self._forward_ids |= ids
                self.recorder.note_batch(())
            return
        if any(
            t.device.type != "meta" and t.untyped_storage().data_ptr() in self._made
            for t in inputs.values()
        ):
            # another part's output (a GAN's fake images): computed by the step, not drawn
            return
        again = bool(inputs) and ids <= self._forward_ids
        self._consumed(inputs)
        if not again and (not inputs or any(id(t) not in self._drawn_ids for t in inputs.values())):
            self.recorder.note_batch(args)

    def _after_backward(self) -> None:
        """No optimizer: a batch drawn, or a forward, after a backward starts the next step."""
        if not self.optimizers and self._backwards and self.recorder is not None:
            self._next_step()

    def _next_step(self) -> None:
        assert self.recorder is not None
        self._backwards = 0
        self._drawn_ids.clear()
        self._forward_ids.clear()
        self._made.clear()
        self._stepped_now.clear()
        self._log_loss()
        self.recorder.end_step()
        self.recorder.begin_step()
        self._stop_if_asked()

    def _stop_if_asked(self) -> None:
        """The run stopped at a difference from its reference: close it and unwind the script."""
        assert self.recorder is not None
        if self.recorder.stopped_early:
            step = self.recorder.step
            self.close()
            raise StopRecording(f"the recording stopped at step {step}")

    def _stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """An optimizer stepped: the step ends once every optimizer followed has (see the module
        docstring)."""
        if (
            self.recorder is None
            or self.model is None
            or not any(optimizer is o for o in self.optimizers)
        ):
            return
        self._stepped_now.add(id(optimizer))
        if len(self._stepped_now) == len(self.optimizers):
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
            # no optimizer: the last step ended with its backward (and the update after it)
            self._after_backward()
            self.recorder.close()
