"""Data-parallel training meant for ``torchrun --nproc-per-node N ddp_torchrun.py``, written the way
tutorial scripts are: the process group from torchrun's environment, a ``Trainer`` class that owns
the loop, a ``DistributedSampler`` told its epoch, and the group torn down at the end.

The planted bug: ``--reseed-at S`` reseeds torch's global stream from entropy on rank 1 before
that rank's step S (dropout draws from it)."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        loader: DataLoader,
        optimizer: torch.optim.Optimizer,
        reseed_at: int | None,
    ) -> None:
        self.rank = int(os.environ["LOCAL_RANK"])
        self.model = DistributedDataParallel(model)
        self.loader = loader
        self.optimizer = optimizer
        self.reseed_at = reseed_at
        self.steps_run = 0

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = functional.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for source, targets in self.recorder.batches(steps=(epoch + 1) * len(self.loader)):
            if self.steps_run == self.reseed_at and self.rank == 1:
                torch.seed()
            loss = self._run_batch(source, targets)
            self.steps_run += 1
        if self.rank == 0:
            print(f"epoch {epoch} | loss {loss:.4f}")

    def train(self, epochs: int) -> None:
        self.recorder = Recorder("run", Trainee(self.model, self.optimizer, self.loader), RecordOptions(steps=epochs * len(self.loader), every=2))
        for epoch in range(epochs):
            self._run_epoch(epoch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--reseed-at", type=int, default=None)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    inputs = torch.randn(64, 16, generator=torch.Generator().manual_seed(1234))
    dataset = TensorDataset(inputs, inputs[:, :4].sum(dim=1, keepdim=True))
    loader = DataLoader(
        dataset, batch_size=8, shuffle=False, sampler=DistributedSampler(dataset, seed=0)
    )
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    Trainer(model, loader, optimizer, args.reseed_at).train(args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
