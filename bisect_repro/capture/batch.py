"""A batch as tensors: the tensors in any nesting of tuples, lists, dicts and dataclasses, by
path, and one digest for many.

``batch_tensors(batch)`` names each tensor by its path (``batch[0]``, ``batch.image``), a NumPy
array of numbers counting as a tensor, and keeps the other leaves as text (cut at 200
characters), so that the recorder, the tracer and the experiments hash a batch the
same way; ``combine_digests`` folds several digests (a whole batch's) into one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["batch_tensors", "combine_digests"]


def batch_tensors(batch: Any, prefix: str = "batch") -> tuple[dict[str, torch.Tensor], list[str]]:
    """The tensors in a batch by path (``batch[0]``, ``batch.image``), and its other leaves as
    text."""
    tensors: dict[str, torch.Tensor] = {}
    others: list[str] = []

    def visit(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            tensors[path] = value
        elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            tensors[path] = torch.from_numpy(np.ascontiguousarray(value))
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{path}.{key}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{path}[{index}]")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for item in dataclasses.fields(value):
                visit(getattr(value, item.name), f"{path}.{item.name}")
        else:
            others.append(f"{path}={_shown(value)}")

    visit(batch, prefix)
    return tensors, others


def _shown(value: Any) -> str:
    """A leaf that is no tensor, as text: its ``repr``, cut short (a long one says little more)."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}...({len(text)} characters)"


def combine_digests(parts: Mapping[str, str] | list[str]) -> str:
    """One digest for several named digests (a whole batch)."""
    text = json.dumps(parts if isinstance(parts, list) else sorted(parts.items()))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
