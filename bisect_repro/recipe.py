"""The recipe contract: what bisect-repro runs, and how it finds it.

A recipe is a function that builds everything a training needs and returns a :class:`Trainee`.
A TARGET names it as ``path/to/file.py:function`` or ``package.module:function``; ``--set
KEY=VALUE`` passes keyword arguments, each VALUE read as a JSON literal when it parses as one.

Loading a file puts its folder first on ``sys.path``, as ``python path/to/file.py`` does, so the
recipe can import its neighbours. A file is loaded once per process under a name derived from its
path; each build calls the function again, so two builds share module globals but nothing the
function creates.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .errors import RecipeError
from .rng import RandomSource
from .stateful import Stateful

__all__ = ["Trainee", "build", "parse_settings", "recipe_file"]


@dataclass
class Trainee:
    """Everything bisect-repro needs to run, record and replay a training."""

    model: torch.nn.Module
    """The model; its parameters and buffers are hashed by ``named_parameters`` names."""
    optimizer: torch.optim.Optimizer
    """The optimizer whose ``step`` the step function calls; its state is hashed per parameter."""
    loader: Iterable[Any]
    """Any iterable of batches, usually a ``torch.utils.data.DataLoader``; iterated for as many epochs as needed."""
    step: Callable[[Any], torch.Tensor] | None = None
    """``step(batch)`` runs one optimisation step and returns the loss. ``None`` for loops you drive yourself."""
    scheduler: Stateful | None = None
    """An optional LR scheduler (anything :class:`Stateful`), saved in checkpoints."""
    generators: Mapping[str, RandomSource] | None = None
    """Extra random streams the recipe uses, by name: torch, NumPy or ``random.Random`` generators."""

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

        return cls(model, optimizer, loader, step, scheduler=scheduler, generators=generators)

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise RecipeError(f"Trainee: model is a {type(self.model).__name__}, expected a torch.nn.Module")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise RecipeError(f"Trainee: optimizer is a {type(self.optimizer).__name__}, expected a torch.optim.Optimizer")
        if not isinstance(self.loader, Iterable):
            raise RecipeError(f"Trainee: loader is a {type(self.loader).__name__}, which cannot be iterated")
        if self.scheduler is not None and not isinstance(self.scheduler, Stateful):
            raise RecipeError(f"Trainee: scheduler is a {type(self.scheduler).__name__} without state_dict/load_state_dict")
        if self.step is not None and not callable(self.step):
            raise RecipeError("Trainee: step must be callable as step(batch) -> loss")


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """``["lr=0.1", "name=x"]`` to ``{"lr": 0.1, "name": "x"}``: JSON literals, else strings."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise RecipeError(f"--set {item!r}: expected KEY=VALUE with KEY a Python identifier")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        settings[key.strip()] = value
    return settings


def _split(target: str) -> tuple[str, str]:
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise RecipeError(f"{target}: expected TARGET as path/to/file.py:function or package.module:function")
    return where, name


def recipe_file(target: str) -> Path | None:
    """The file a TARGET will import, when it names one by path."""
    where, _ = _split(target)
    return Path(where).resolve() if where.endswith(".py") else None


def _load_module(target: str) -> ModuleType:
    where, _ = _split(target)
    path = recipe_file(target)
    if path is None:
        try:
            return importlib.import_module(where)
        except ImportError as error:
            raise RecipeError(f"{target}: cannot import {where} ({error}); check the module name and that it is installed") from None
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file; check the TARGET path")
    name = f"_bisect_repro_recipe_{path.stem}_{hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RecipeError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise RecipeError(f"{path}: failed while importing ({type(error).__name__}: {error})") from error
    return module


def build(target: str, settings: Mapping[str, Any] | None = None) -> Trainee:
    """Import TARGET and call it with ``settings`` as keyword arguments."""
    _, name = _split(target)
    module = _load_module(target)
    function = getattr(module, name, None)
    if not callable(function):
        raise RecipeError(f"{target}: {module.__name__} has no function {name!r}")
    kwargs = dict(settings or {})
    try:
        inspect.signature(function).bind(**kwargs)
    except TypeError as error:
        raise RecipeError(f"{target}: cannot call {name} with {kwargs} ({error}); check the --set keys") from None
    try:
        trainee = function(**kwargs)
    except Exception as error:
        raise RecipeError(f"{target}: failed while building ({type(error).__name__}: {error})") from error
    if not isinstance(trainee, Trainee):
        raise RecipeError(f"{target}: returned a {type(trainee).__name__}; a recipe must return bisect_repro.Trainee")
    return trainee
