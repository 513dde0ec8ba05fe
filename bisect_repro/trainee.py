"""The recipe contract: :class:`Trainee`, everything bisect-repro needs to run, record and replay a
training.

It is the currency between the layers: ``capture`` takes a trainee's state, ``record`` records
one, ``replay`` rebuilds one. A recipe is a function that builds everything and returns one (see
:mod:`bisect_repro.record.recipe`); a loop you drive yourself wraps its pieces in one.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

from .errors import RecipeError
from .stateful import Stateful

__all__ = ["Calls", "NoOptimizer", "RandomSource", "Trainee", "optimizer_prefix"]

RandomSource = Union[torch.Generator, np.random.Generator, np.random.RandomState, random.Random]  # noqa: UP007 (a runtime alias on 3.10)
"""A random stream a recipe may own: a torch, NumPy or Python generator."""


class Calls:
    """Batches from a function called once per batch (``get_batch()``): an endless source."""

    def __init__(self, fetch: Callable[[], Any]) -> None:
        self.fetch = fetch

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield self.fetch()


def optimizer_prefix(index: int) -> str:
    """How the state of a trainee's ``index``-th optimizer is named: ``optimizer`` for the first,
    ``optimizer1``, ``optimizer2``, ... for the others (``optimizer1.netG.main.0.weight.exp_avg``,
    ``optimizer1.group0.lr``)."""
    return "optimizer" if index == 0 else f"optimizer{index}"


class NoOptimizer(torch.optim.Optimizer):
    """Stands for the optimizer of a loop that has none: it holds the model's parameters, keeps no
    state and its ``step`` does nothing (the loop updates the weights itself)."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        super().__init__(list(params), {})

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        return None


@dataclass
class Trainee:
    """Everything bisect-repro needs to run, record and replay a training."""

    model: torch.nn.Module
    """The model; its parameters and buffers are hashed by ``named_parameters`` names. A model
    wrapped by ``torch.compile``, Lightning Fabric or ``DataParallel`` is held as the module it
    wraps (its names, not ``_orig_mod.``, ``_forward_module.`` or ``module.`` ones, so that a
    wrapped run compares with an unwrapped one); the step calls what it calls."""
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None
    """The optimizer whose ``step`` the step function calls; its state is hashed per parameter.
    A list (``[opt_d, opt_g]``, a GAN's two, one per model part) gives several: each one's state
    and settings are hashed, saved and restored, named by :func:`optimizer_prefix`; the first is
    then ``optimizer`` and all of them ``optimizers``. A step is still one call of ``step``,
    however many optimizers it steps.
    ``None`` for a loop that updates the weights itself (``p.data.add_(p.grad, alpha=-lr)``): the
    step is then whatever the loop does between two batches, and the model's parameters, buffers
    and gradients are the whole state (an :class:`NoOptimizer` holds the parameters)."""
    loader: Iterable[Any] | Callable[[], Any]
    """Any iterable of batches, usually a ``torch.utils.data.DataLoader``, iterated for as many
    epochs as needed; or a function called for each batch (``get_batch``), an endless source."""
    step: Callable[[Any], torch.Tensor] | None = None
    """``step(batch)`` runs one optimisation step and returns the loss. ``None`` for loops you drive
    yourself."""
    scheduler: Stateful | None = None
    """An optional LR scheduler (anything :class:`Stateful`), saved in checkpoints."""
    generators: Mapping[str, RandomSource] | None = None
    """Extra random streams the recipe uses, by name: torch, NumPy or ``random.Random``
    generators."""
    state: Mapping[str, Stateful] | None = None
    """Any other state a step reads, by name (a counter, a curriculum, an EMA): objects with
    ``state_dict()`` / ``load_state_dict()``, saved in checkpoints, hashed in snapshots and restored
    with the rest, so that a replayed step sees what the recorded one saw. A step that reads state
    kept anywhere else (a closure, a global) cannot be replayed exactly, and compare says so."""
    optimizers: Sequence[torch.optim.Optimizer] = ()
    """Every optimizer, the first being :attr:`optimizer`; set from ``optimizer`` when left
    empty."""

    @classmethod
    def supervised(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loader: Iterable[Any],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        scheduler: Stateful | None = None,
        generators: Mapping[str, RandomSource] | None = None,
        state: Mapping[str, Stateful] | None = None,
    ) -> Trainee:
        """A trainee whose step is the usual one on ``(inputs, targets)`` batches: zero the
        gradients, ``loss_fn(model(inputs), targets)``, backward, ``optimizer.step()``, then
        ``scheduler.step()`` when there is a scheduler."""

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            inputs, targets = batch
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()  # type: ignore[attr-defined]
            return loss

        return cls(
            model, optimizer, loader, step, scheduler=scheduler, generators=generators, state=state
        )

    @property
    def source(self) -> Iterable[Any]:
        """The loader; a function of batches, wrapped as :class:`Calls` (never a bare callable)."""
        assert isinstance(self.loader, Iterable), "wrapped in __post_init__"
        return self.loader

    def _optimizers(self) -> None:
        """``optimizer`` one optimizer and ``optimizers`` all of them, the first first; a list given
        as ``optimizer`` (or ``optimizers`` alone) sets both."""
        given = self.optimizer
        if isinstance(given, torch.optim.Optimizer):
            self.optimizers = (given, *(o for o in self.optimizers if o is not given))
        elif isinstance(given, (list, tuple)):
            if not given:
                raise RecipeError(
                    "Trainee: optimizer is an empty list; give one optimizer or more, or None"
                )
            self.optimizers = tuple(given)
        elif given is None:
            self.optimizers = tuple(self.optimizers) or (NoOptimizer(self.model.parameters()),)
        else:
            self.optimizers = [given]  # type: ignore[list-item]  # not an optimizer: refused just below
        for optimizer in self.optimizers:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise RecipeError(
                    f"Trainee: optimizer is a {type(optimizer).__name__}, expected a "
                    "torch.optim.Optimizer; "
                    "give optimizer=None for a loop that updates the weights itself"
                )
        self.optimizer = self.optimizers[0]

    @property
    def optim(self) -> torch.optim.Optimizer:
        """The optimizer; for a loop without one, the :class:`NoOptimizer` holding the model's
        parameters."""
        assert isinstance(self.optimizer, torch.optim.Optimizer), "set in __post_init__"
        return self.optimizer

    @property
    def named_optimizers(self) -> list[tuple[str, torch.optim.Optimizer]]:
        """Every optimizer with the prefix its state is named by (:func:`optimizer_prefix`)."""
        return [
            (optimizer_prefix(index), optimizer) for index, optimizer in enumerate(self.optimizers)
        ]

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise RecipeError(
                f"Trainee: model is a {type(self.model).__name__}, expected a torch.nn.Module"
            )
        self.model = _unwrapped(self.model)
        self._optimizers()
        if callable(self.loader) and not isinstance(self.loader, Iterable):
            self.loader = Calls(self.loader)
        if not isinstance(self.loader, Iterable):
            raise RecipeError(
                f"Trainee: loader is a {type(self.loader).__name__}, which cannot be iterated"
            )
        if self.scheduler is not None and not isinstance(self.scheduler, Stateful):
            raise RecipeError(
                f"Trainee: scheduler is a {type(self.scheduler).__name__} without "
                "state_dict/load_state_dict"
            )
        for name, value in (self.state or {}).items():
            if not isinstance(value, Stateful):
                raise RecipeError(
                    f"Trainee: state[{name!r}] is a {type(value).__name__} without "
                    "state_dict/load_state_dict"
                )
        if self.step is not None and not callable(self.step):
            raise RecipeError("Trainee: step must be callable as step(batch) -> loss")


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside the wrappers that hold the same parameters under other names:
    ``torch.compile``'s (``_orig_mod.``), Lightning Fabric's (``_forward_module.``) and
    ``DataParallel``'s (``module.``); else ``model`` itself. ``DistributedDataParallel`` is kept
    (a distributed run's layout names it)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    if eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        return _unwrapped(model._orig_mod)
    inner = getattr(model, "_original_module", None)  # Lightning Fabric's _FabricModule
    if type(model).__name__ == "_FabricModule" and isinstance(inner, torch.nn.Module):
        return _unwrapped(inner)
    if type(model) is torch.nn.DataParallel:
        return _unwrapped(model.module)
    return model
