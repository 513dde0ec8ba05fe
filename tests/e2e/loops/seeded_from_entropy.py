"""A loop that seeds NumPy's and Python's global streams from entropy at its start, as many scripts
do (``np.random.seed()``, ``random.seed()``), and draws noise from both in every step."""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    np.random.seed()
    random.seed()
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(96, 8, generator=data), torch.randn(96, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    options = RecordOptions(steps=4, every=2, checkpoint_every=2, force=True)
    with Recorder(args.out, Trainee(model, optimizer, loader), options) as recorder:
        for x, y in recorder.batches():
            noise = torch.from_numpy(np.random.normal(0.0, 0.1, size=tuple(x.shape))).float()
            scale = 1.0 + 0.1 * random.random()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x * scale + noise), y)
            loss.backward()
            optimizer.step()
            recorder.log(loss)


if __name__ == "__main__":
    main()
