"""Which optimizer's ``step()`` is running now, by torch's global optimizer step hooks.

A step of a recorded script begins at its model's first forward, which for a closure optimizer
(LBFGS) is already inside ``optimizer.step(closure)``: a tracer that starts there must know the
step it is in, since the updates between the closure's passes belong to it.
:func:`track` keeps the count while it is in place; :func:`running` reads it.

Where the guarantees stop: only optimizers that call torch's step hooks (every
``torch.optim.Optimizer``) are seen; steps of one optimizer called inside another's are counted,
and the innermost is the one running.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

__all__ = ["running", "track"]

_RUNNING: list[torch.optim.Optimizer] = []


def _entered(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    _RUNNING.append(optimizer)


def _left(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if _RUNNING and _RUNNING[-1] is optimizer:
        _RUNNING.pop()


def track() -> Callable[[], None]:
    """Follow every optimizer's ``step()`` from now on; returns what stops following them."""
    handles = [register_optimizer_step_pre_hook(_entered), register_optimizer_step_post_hook(_left)]

    def stop() -> None:
        for handle in handles:
            handle.remove()
        _RUNNING.clear()

    return stop


def running() -> torch.optim.Optimizer | None:
    """The optimizer whose ``step()`` is running now (``None``: none, or not followed)."""
    return _RUNNING[-1] if _RUNNING else None
