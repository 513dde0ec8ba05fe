"""A batch as tensors: the tensors in any nesting of tuples, lists and dicts, by path, and one
digest for many.

``batch_tensors(batch)`` names each tensor by its path (``batch[0]``, ``batch.image``) and keeps
the other leaves as text, so that the recorder, the tracer and the experiments hash a batch the
same way; ``combine_digests`` folds several digests (a whole batch's) into one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

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
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{path}.{key}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{path}[{index}]")
        else:
            others.append(f"{path}={value!r}")

    visit(batch, prefix)
    return tensors, others


def combine_digests(parts: Mapping[str, str] | list[str]) -> str:
    """One digest for several named digests (a whole batch)."""
    text = json.dumps(parts if isinstance(parts, list) else sorted(parts.items()))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
