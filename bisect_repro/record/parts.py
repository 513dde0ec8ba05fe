"""The model of a script with several optimizers: the modules they update, each named by the
script's own variable.

A GAN makes two models and two optimizers (``netD``, ``netG``) and never puts the models in one
module. :func:`model_of` finds, for each optimizer, the module among the script's variables that
holds most of its parameters (the smallest such one where several hold as many), and joins those
modules into one :class:`Parts` module whose children are named by their variables
(``netD.main.0.weight``), so that every name a comparison prints says which part it is in. A
module among the variables that holds every optimizer's parameters is the model itself.

The variables looked at are the locals of the script's functions running at the moment (the
frames outside torch and bisect-repro, innermost first; in a method, the attributes of its
``self`` too: a trainer's ``self.netG``), then the globals of ``__main__``; the
first name found for a module is its name, and a part no variable names is named by its class
(``Generator``), with a number after it where two would be named alike. An optimizer's tensors
that no module holds are held by a module of their own, named by the optimizer's prefix
(``optimizer``), each by its variable (``input_img``, a buffer where it is no ``nn.Parameter``:
the same tensor object, so that a restore writes into it); where none of them is a module's
parameter, the module whose forward takes them (a frozen network) is a part too.

Where the guarantees stop: a module only reachable as an attribute of something else (``self.gen``
of a trainer object) is not among the variables, so its optimizer's parameters are named by the
optimizer's prefix and their index (``optimizer1.group0.param3``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

import torch

from ..trainee import optimizer_prefix

__all__ = ["Parts", "model_of", "script_variables"]

_SKIPPED = tuple(
    str(Path(module.__file__ or "").parent)
    for module in (torch, sys.modules[__name__.split(".")[0]])
)
"""The folders whose frames are not the script's: torch's and this package's."""


class Parts(torch.nn.Module):
    """Modules that are trained together without a module of their own holding them; never
    called."""


def script_variables(frame: FrameType | None) -> list[tuple[str, torch.nn.Module]]:
    """The modules bound to the script's variables, each once, by the first name found (see the
    module docstring)."""
    found: dict[int, tuple[str, torch.nn.Module]] = {}
    for scope in _scopes(frame):
        for name, value in scope.items():
            if (
                isinstance(value, torch.nn.Module)
                and not isinstance(value, Parts)
                and name != "self"
                and id(value) not in found
            ):
                found[id(value)] = (name, value)
    return list(found.values())


def _scopes(frame: FrameType | None) -> list[dict[str, object]]:
    """The script's variables, innermost first: each running function's locals (in a method of an
    object that is no module, its attributes after them), then ``__main__``'s globals."""
    scopes: list[dict[str, object]] = []
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_SKIPPED):
            scopes.append(dict(frame.f_locals))
            owner = frame.f_locals.get("self")
            if (
                owner is not None
                and not isinstance(owner, torch.nn.Module)
                and hasattr(owner, "__dict__")
            ):
                scopes.append(dict(vars(owner)))
        frame = frame.f_back
    main = sys.modules.get("__main__")
    scopes.append(dict(vars(main)) if main is not None else {})
    return scopes


def _ids(module: torch.nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


def script_tensors(frame: FrameType | None) -> dict[int, str]:
    """``id(tensor)`` to the first name of a script's variable bound to it (see the module
    docstring), for the tensors an optimizer trains that no module holds (an image optimized
    through a frozen network)."""
    found: dict[int, str] = {}
    for scope in _scopes(frame):
        for name, value in scope.items():
            if isinstance(value, torch.Tensor) and name.isidentifier() and id(value) not in found:
                found[id(value)] = name
    return found


def _holder(
    optimizer: torch.optim.Optimizer, ids: set[int], names: dict[int, str]
) -> torch.nn.Module:
    """A module holding the tensors ``ids`` of ``optimizer`` that no module found holds: each a
    parameter where it is an ``nn.Parameter``, else a buffer (the same tensor object, so that a
    restore writes into it), named by its variable where one names it."""
    holder = torch.nn.Module()
    for g, group in enumerate(optimizer.param_groups):
        for i, param in enumerate(group["params"]):
            if id(param) not in ids:
                continue
            name = names.get(id(param), f"group{g}_param{i}")
            if hasattr(holder, name):
                name = f"group{g}_param{i}"
            if isinstance(param, torch.nn.Parameter):
                holder.register_parameter(name, param)
            else:
                holder.register_buffer(name, param)
    return holder


def model_of(
    optimizers: list[torch.optim.Optimizer], first: torch.nn.Module, frame: FrameType | None
) -> torch.nn.Module:
    """The model the optimizers train: one module holding all their parameters, or their
    :class:`Parts` (``first``: the module whose forward is running, one of them)."""
    held = [
        {id(p) for group in optimizer.param_groups for p in group["params"]}
        for optimizer in optimizers
    ]
    every = set().union(*held)
    variables = script_variables(frame)
    tensor_names = script_tensors(frame) if every - _ids(first) else {}
    candidates = [*variables, *([] if any(m is first for _, m in variables) else [("", first)])]
    names = {id(m): name for name, m in candidates if name}
    sizes = {id(m): _ids(m) for _, m in candidates}
    whole = [m for _, m in candidates if every <= sizes[id(m)]]
    if whole:
        return min(whole, key=lambda m: len(sizes[id(m)]))
    chosen: list[torch.nn.Module] = []
    for ids in held:
        holding = [m for _, m in candidates if sizes[id(m)] & ids]
        if not holding:
            continue
        best = max(holding, key=lambda m: (len(sizes[id(m)] & ids), -len(sizes[id(m)])))
        if not any(sizes[id(best)] <= sizes[id(other)] for other in chosen):
            chosen.append(best)
    if not any(sizes[id(first)] & ids for ids in held):
        chosen.append(first)  # it trains none of them: its inputs are what they train
    loose = [(o, ids - set().union(*(sizes[id(m)] for m in chosen))) for o, ids in enumerate(held)]
    if len(chosen) == 1 and not any(ids for _, ids in loose):
        return chosen[0]
    parts = Parts()
    for o, ids in loose:
        if ids:
            parts.add_module(optimizer_prefix(o), _holder(optimizers[o], ids, tensor_names))
    for module in chosen:
        name = names.get(id(module)) or type(module).__name__
        unique, number = name, 1
        while hasattr(parts, unique) or unique in parts._modules:
            number += 1
            unique = f"{name}{number}"
        parts.add_module(unique, module)
    return parts
