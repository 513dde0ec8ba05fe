"""A small MLP whose first layer centres its input on the mean of the whole batch, knowing nothing
of bisect-repro: a reduction ATen splits across its intra-op threads, so the rounding of every
step depends on the thread count (OMP_NUM_THREADS)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
inputs, targets = torch.randn(512, 1024, generator=g), torch.randn(512, 1, generator=g)


class Centre(nn.Module):
    def forward(self, x):
        return x - x.mean()


model = nn.Sequential(Centre(), nn.Linear(1024, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(args.steps):
    loss = nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
