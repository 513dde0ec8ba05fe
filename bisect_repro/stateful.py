"""The ``Stateful`` protocol that every stateful piece of bisect-repro implements.

``state_dict()`` returns a tree of JSON values and tensors (see ``codec.py``);
``load_state_dict(state)`` puts the object back into that state. Optimizers, LR schedulers and
modules already follow it, and so do ``RandomStreams``, ``DataStream`` and ``TrainingState``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful"]


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...
