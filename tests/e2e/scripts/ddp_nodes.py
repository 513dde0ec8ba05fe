"""Data-parallel training for ``torchrun --nnodes 2 --nproc-per-node 1 ddp_nodes.py``: one rank a
node, the process group from torchrun's environment, 8 steps (2 epochs of 4).

The planted bug: ``--reseed-at S`` reseeds torch's global stream from entropy on global rank 1
before its step S (dropout draws from it)."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--reseed-at", type=int, default=None)
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="sleep this long each step (a run to kill midway)",
    )
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(1234))
    dataset = TensorDataset(inputs, inputs[:, :2].sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            if step == args.reseed_at and dist.get_rank() == 1:
                torch.seed()
            optimizer.zero_grad()
            functional.mse_loss(model(source), targets).backward()
            optimizer.step()
            step += 1
            time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
