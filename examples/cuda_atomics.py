"""Token features pooled by index on a GPU, the way message passing and embedding bags do it: the
kernels that add by index use atomic adds, whose order, and so whose float rounding, changes
from run to run. Fully seeded otherwise.

``op`` picks the kernel (``index_add``, ``scatter_add`` or ``index_put``, that is
``index_put_(..., accumulate=True)``) and ``where`` the pass it runs in:

- ``forward``: the pooling itself adds by index;
- ``backward``: the forward reads rows by index (``index_select``, ``gather``, ``table[idx]``),
  and the gradient of that read adds by index.

``deterministic=true`` is the fix: ``torch.use_deterministic_algorithms(True)``, with the cuBLAS
workspace setting it requires. Without a GPU the recipe runs on the CPU, where these kernels
are deterministic on one thread.

    bisect-repro record examples/cuda_atomics.py:build --set op=scatter_add --out runs/a --steps 12
    bisect-repro record examples/cuda_atomics.py:build --set op=scatter_add --out runs/b --steps 12
    bisect-repro compare runs/a runs/b
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Trainee

__all__ = ["build"]

OPS = ("index_add", "scatter_add", "index_put")


def add_by_index(op: str, rows: int, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``out[index[i]] += source[i]`` for every i, by the kernel ``op``."""
    out = source.new_zeros(rows, source.shape[1])
    if op == "index_add":
        return out.index_add(0, index, source)
    if op == "scatter_add":
        return out.scatter_add(0, index.unsqueeze(1).expand_as(source), source)
    return out.index_put((index,), source, accumulate=True)


def read_by_index(op: str, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]``, by the read whose backward adds by index with the kernel ``op``."""
    if op == "index_add":
        return table.index_select(0, index)  # backward: index_add_
    if op == "scatter_add":
        # backward: scatter_add_
        return table.gather(0, index.unsqueeze(1).expand(-1, table.shape[1]))
    return table[index]  # backward: index_put_ with accumulate


class Pooling(nn.Module):
    """Token embeddings, mixed, then summed per segment; a linear head per segment."""

    def __init__(self, op: str, where: str, vocab: int, dim: int, segments: int) -> None:
        super().__init__()
        self.op, self.where, self.segments = op, where, segments
        self.table = nn.Parameter(torch.randn(vocab, dim) * 0.1)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
        if self.where == "backward":
            rows = self.mix(read_by_index(self.op, self.table, tokens))
            # segments are contiguous: a plain sum
            pooled = rows.reshape(self.segments, -1, rows.shape[1]).sum(1)
        else:
            rows = self.mix(nn.functional.embedding(tokens, self.table))
            pooled = add_by_index(self.op, self.segments, segment, rows)
        return self.head(torch.tanh(pooled)).squeeze(1)


def build(
    seed: int = 0,
    op: str = "scatter_add",
    where: str = "forward",
    deterministic: bool = False,
    vocab: int = 64,
    dim: int = 64,
    segments: int = 32,
    tokens_per_segment: int = 512,
) -> Trainee:
    if op not in OPS or where not in ("forward", "backward"):
        raise ValueError(
            f"op must be one of {OPS} and where forward or backward, not {op!r} and {where!r}"
        )
    if deterministic:
        # read when cuBLAS starts: before any matmul
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic)
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = torch.Generator().manual_seed(7)
    count = 64
    tokens = torch.randint(0, vocab, (count, segments * tokens_per_segment), generator=data)
    segment = torch.arange(segments).repeat_interleave(tokens_per_segment).expand(count, -1)
    targets = torch.randn(count, segments, generator=data)
    loader = DataLoader(
        TensorDataset(tokens, segment, targets),
        batch_size=1,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = Pooling(op, where, vocab, dim, segments).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(batch: list[torch.Tensor]) -> torch.Tensor:
        tokens, segment, target = (t[0].to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(tokens, segment), target)
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)
