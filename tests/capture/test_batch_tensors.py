"""A batch's tensors through any nesting: tuples, lists, mappings, dataclasses, NumPy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bisect_repro.capture.batch import batch_tensors


@dataclass
class Inputs:
    ids: torch.Tensor
    mask: np.ndarray
    name: str


def test_dataclasses_and_numpy_arrays_are_walked_and_other_leaves_kept_short() -> None:
    ids = torch.arange(3)
    batch = {"inputs": Inputs(ids, np.ones(2, dtype=np.float32), "x"), "rest": [ids, "y" * 500]}
    tensors, others = batch_tensors(batch)
    assert list(tensors) == ["batch.inputs.ids", "batch.inputs.mask", "batch.rest[0]"]
    assert tensors["batch.inputs.ids"] is ids and torch.equal(
        tensors["batch.inputs.mask"], torch.ones(2)
    )
    assert others[0] == "batch.inputs.name='x'"
    assert others[1].endswith("...(502 characters)") and len(others[1]) < 250
