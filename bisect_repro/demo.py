"""The demo: a recipe that really diverges on a CPU, recorded twice and compared.

The recipe looks up token embeddings by advanced indexing (``table[tokens]``). Its backward pass
accumulates the gradient rows by index (``index_put_`` with ``accumulate=True``); on two or more
threads the order of those float additions varies from run to run, so two fully seeded runs drift
apart at the level of rounding. Small batches stay on one thread and are deterministic.

The order varies only where threads run at once, which a busy machine may not let them do: on two
threads, two runs of one backward pass from one state came out equal in 40 of 60 tries on a
loaded two-core machine, enough for a recorded pair to agree on a step and for the experiments to
see the step repeat. Four threads and batches of 8,192 indices, each gradient row summed from
hundreds of them, came out equal in 2 of 60 tries on the same machine: the demo finds the
nondeterministic op every time (see the README).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .trainee import Trainee

__all__ = ["TARGET", "build", "record_pair"]

TARGET = "bisect_repro.demo:build"


class Lookup(nn.Module):
    """An embedding table read by advanced indexing."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, dim) * 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]


class BagOfTokens(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = Lookup(vocab, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1)).squeeze(-1)


def build(
    seed: int = 0,
    vocab: int = 1000,
    dim: int = 32,
    tokens_per_sample: int = 128,
    batch_size: int = 64,
    threads: int = 4,
    deterministic: bool = False,
) -> Trainee:
    """Fully seeded; only the order of the gradient accumulation varies."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, vocab, (2048, tokens_per_sample), generator=data)
    targets = torch.randn(2048, generator=data)
    loader = DataLoader(
        TensorDataset(tokens, targets),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    model = BagOfTokens(vocab, dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)


def record_pair(
    out: Path | None = None, *, steps: int = 20, every: int = 5, checkpoint_every: int = 10
) -> tuple[Path, Path]:
    """Record the demo recipe twice, into ``out/a`` and ``out/b``."""
    from .record.recipe import build as build_target
    from .record.recorder import RecordOptions, record

    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="bisect-repro-demo-"))
    options = RecordOptions(steps=steps, every=every, checkpoint_every=checkpoint_every, force=True)
    paths = []
    for name in ("a", "b"):
        paths.append(record(build_target(TARGET), folder / name, options, target=TARGET))
    return paths[0], paths[1]
