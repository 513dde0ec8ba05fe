"""A plain DataLoader training loop, knowing nothing of bisect-repro, in the style of the classic
examples: a model, an optimizer, epochs over a loader that shuffles from torch's global stream, and
a little noise from a seeded NumPy generator. ``--reseed-at-epoch E`` plants a bug: torch is
reseeded from entropy when epoch E starts (as a helper that reseeds per epoch would), so that
epoch's shuffle differs; ``--unseeded-noise`` plants another: the noise generator is made without
a seed, so every run draws other noise."""

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--reseed-at-epoch", type=int, default=None)
    parser.add_argument("--unseeded-noise", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(None if args.unseeded_noise else 7)
    data = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(128, 8, generator=data), torch.randn(128, 1, generator=data)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    recorder = Recorder("run", Trainee(model, optimizer, loader), RecordOptions(steps=args.epochs * len(loader), every=2))
    for epoch in range(args.epochs):
        if epoch == args.reseed_at_epoch:
            torch.seed()
        for x, y in recorder.batches(steps=(epoch + 1) * len(loader)):
            x = x + torch.from_numpy(rng.normal(0.0, 0.05, size=x.shape).astype(np.float32))
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
