"""What ``torch.compile`` compiled in this process, and compiling it again under other settings.

:func:`watch_compile` wraps ``torch.compile`` (``nn.Module.compile`` calls it too) before the
code runs: each call is noted as a :class:`CompileCall` (what was compiled, the backend, the mode,
the options) and its result is returned unchanged, so the code computes what it would unwatched.
Dynamo is told to guard on module hooks, so that a step traced with hooks (see
:mod:`bisect_repro.capture.trace`) fires them in a compiled model too (by default Dynamo keeps
running the code it compiled before the hooks were added, and the trace misses every forward).

:func:`recompile` clears Dynamo's caches and compiles every noted module again, in place, through
``torch.compile`` as the code called it: the object the code holds (the ``OptimizedModule`` it
got back, or the module whose ``compile()`` it called) compiles afresh at its next call, and
``torch.compile`` then reads the compiler bisector's state (its backend, its config switches) as
it does for any call. :func:`bisect_trial` is one trial of the compiler bisector driven from
another process: the bisector's state lives in files in a folder both processes read.

Where the guarantees stop: a function compiled on its own (``torch.compile(step)``), and a
backend given as a callable, cannot be compiled again in place; such a call is noted with
``replayable`` false and a reason. Calls made before the watch was installed are not seen.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["CompileCall", "bisect_trial", "calls", "recompile", "watch_compile"]

_KEPT = ("mode", "options", "dynamic", "fullgraph")


@dataclass(frozen=True)
class CompileCall:
    """One ``torch.compile`` call the code made."""

    target: str
    """What was compiled: a module's class name, or a function's name."""
    backend: str
    """The backend's name (``inductor`` by default)."""
    settings: str
    """The other arguments given (``mode``, ``options``, ``dynamic``, ``fullgraph``), as JSON."""
    replayable: bool
    why_not: str = ""
    """Why it cannot be compiled again in place (empty when it can)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompileCall:
        return cls(
            str(data["target"]),
            str(data["backend"]),
            str(data["settings"]),
            bool(data["replayable"]),
            str(data.get("why_not", "")),
        )


@dataclass
class _Noted:
    call: CompileCall
    again: Callable[[dict[str, Any]], None] | None
    """Compiles the same object again in place, with these arguments (``None``: it cannot be)."""
    kwargs: dict[str, Any]
    """The arguments the code gave."""


_noted: list[_Noted] = []
_original: Callable[..., Any] | None = None


def _settings(kwargs: dict[str, Any]) -> str:
    kept = {k: kwargs[k] for k in _KEPT if kwargs.get(k) is not None}
    return json.dumps(kept, sort_keys=True, default=repr)


def _compile(target: Any, kwargs: dict[str, Any]) -> Any:
    assert _original is not None
    return _original(target, **kwargs)


def _late_forward(
    module: torch._dynamo.eval_frame.OptimizedModule,
) -> Callable[[dict[str, Any]], None]:
    """Make ``module.forward`` look up its compiled forward at each call, so that a compilation made
    while a call is under way (a framework's step starts in a forward hook) serves that very
    call."""
    current = {"forward": module.forward}

    def forward(*args: Any, **kwargs: Any) -> Any:
        return current["forward"](*args, **kwargs)

    module.forward = forward
    held = weakref.ref(module)

    def module_again(kwargs: dict[str, Any]) -> None:
        if (wrapper := held()) is not None:
            current["forward"] = _compile(wrapper._orig_mod, kwargs).forward

    return module_again


def _again(target: Any, result: Any) -> Callable[[dict[str, Any]], None] | None:
    """How to compile ``target`` again so that the object the code holds uses the new
    compilation."""
    if isinstance(result, torch._dynamo.eval_frame.OptimizedModule) and not hasattr(
        result._orig_mod, "_initialize_hook"
    ):
        return _late_forward(result)
    owner = getattr(target, "__self__", None)
    if (
        isinstance(owner, torch.nn.Module)
        and getattr(target, "__func__", None) is torch.nn.Module._call_impl
    ):
        held_owner = weakref.ref(owner)

        def method_again(kwargs: dict[str, Any]) -> None:
            module = held_owner()
            if module is not None:
                module._compiled_call_impl = _compile(module._call_impl, kwargs)

        return method_again
    return None


def _name(target: Any) -> str:
    owner = getattr(target, "__self__", None)
    if isinstance(target, torch.nn.Module):
        return type(target).__name__
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    return str(getattr(target, "__qualname__", type(target).__name__))


def _note(target: Any, result: Any, kwargs: dict[str, Any]) -> None:
    backend = kwargs.get("backend", "inductor")
    named = isinstance(backend, str)
    again = _again(target, result) if named else None
    why = (
        ""
        if again is not None
        else ("a function compiled on its own" if named else "its backend is a callable")
    )
    name = backend if named else str(getattr(backend, "__name__", type(backend).__name__))
    _noted.append(
        _Noted(
            CompileCall(_name(target), name, _settings(kwargs), again is not None, why),
            again,
            kwargs,
        )
    )


def watch_compile() -> None:
    """Wrap ``torch.compile`` so that each call is noted (once per process)."""
    global _original
    if _original is not None:
        return
    # Dynamo then guards on module hooks: a traced step (hooks added) compiles with them and fires
    # them, an untraced one runs the code compiled without them, as the recording did.
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    _original = original = torch.compile

    @functools.wraps(original)
    def compile_(model: Any = None, **kwargs: Any) -> Any:
        if model is None:  # used as a decorator factory: ``@torch.compile(...)``
            return functools.partial(compile_, **kwargs)
        result = original(model, **kwargs)
        _note(model, result, kwargs)
        return result

    torch.compile = compile_


def calls() -> list[CompileCall]:
    """The calls noted so far, in order."""
    return [noted.call for noted in _noted]


def recompile(*, inductor: bool = True) -> None:
    """Clear Dynamo's caches and compile every noted object again, in place; with ``inductor``
    false (another backend is tried), without Inductor's ``mode`` and ``options``."""
    torch._dynamo.reset()
    for noted in _noted:
        if noted.again is not None:
            dropped = () if inductor else ("mode", "options")
            noted.again({k: v for k, v in noted.kwargs.items() if k not in dropped})


def bisect_trial(folder: str) -> None:
    """Set this process up for one trial of a compiler bisection whose state is in ``folder``
    (written by :meth:`CompilerBisector.do_bisect` in the controller), and compile again."""
    from torch._inductor import compiler_bisector

    compiler_bisector.CompilerBisector.in_process_cache = folder
    compiler_bisector.CompilerBisector.bisection_enabled = True
    compiler_bisector.subsystem_call_counter.clear()
    recompile(inductor=compiler_bisector.CompilerBisector.get_backend() in (None, "inductor"))
