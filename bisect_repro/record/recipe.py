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
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import RecipeError
from ..trainee import Trainee
from . import pinned

__all__ = ["build", "module_file", "parse_settings", "recipe_file"]


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
        raise RecipeError(
            f"{target}: expected TARGET as path/to/file.py:function or package.module:function"
        )
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
            raise RecipeError(
                f"{target}: cannot import {where} ({error}); check the module name and that it is "
                "installed"
            ) from None
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file; check the TARGET path")
    digest = hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()
    name = f"_bisect_repro_recipe_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path, loader=pinned.loader(name, path))
    if spec is None or spec.loader is None:
        raise RecipeError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise RecipeError(
            f"{path}: failed while importing ({type(error).__name__}: {error})"
        ) from error
    return module


def module_file(name: str) -> Path | None:
    """The file module ``name`` is imported from, resolved (``None``: not found). Finding it imports
    the module's parent packages, as importing it would."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return (
        Path(spec.origin).resolve()
        if spec is not None and spec.origin and spec.has_location
        else None
    )


def _from_file(module: ModuleType, function: Any, expected: Path) -> bool:
    """Whether ``module`` was loaded from ``expected`` and ``function`` is a Python function (one
    the file defines or imports: the file decides), not a builtin or a class."""
    loaded = getattr(module, "__file__", None)
    return (
        loaded is not None
        and Path(loaded).resolve() == expected
        and inspect.isfunction(inspect.unwrap(function))
    )


def build(
    target: str, settings: Mapping[str, Any] | None = None, *, expected: Path | None = None
) -> Trainee:
    """Import TARGET and call it with ``settings`` as keyword arguments.

    ``expected`` (a replay): the file whose SHA-256 was checked; the module imported must be that
    file and the function a Python function of it, or nothing is called."""
    _, name = _split(target)
    module = _load_module(target)
    function = getattr(module, name, None)
    if not callable(function):
        raise RecipeError(f"{target}: {module.__name__} has no function {name!r}")
    if expected is not None and not _from_file(module, function, expected):
        raise RecipeError(
            f"{target}: {name} is not a function of {expected}, the file that was checked; nothing "
            "was run"
        )
    kwargs = dict(settings or {})
    try:
        inspect.signature(function).bind(**kwargs)
    except TypeError as error:
        raise RecipeError(
            f"{target}: cannot call {name} with {kwargs} ({error}); check the --set keys"
        ) from None
    try:
        trainee = function(**kwargs)
    except Exception as error:
        raise RecipeError(
            f"{target}: failed while building ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(trainee, Trainee):
        raise RecipeError(
            f"{target}: returned a {type(trainee).__name__}; a recipe must return "
            "bisect_repro.Trainee"
        )
    return trainee
