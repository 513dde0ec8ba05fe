"""A classifier trained with Lightning Fabric in the shape of Fabric's examples: ``fabric.setup``
wraps the model and the optimizer (the model's parameters are then named under
``_forward_module.``), ``fabric.setup_dataloaders`` the loader, ``fabric.backward`` the loss.
The run is seeded with ``seed_everything`` only when ``--seed`` is given.
"""

import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.fc1 = nn.Linear(4 * 6 * 6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 1)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def run(args):
    fabric = L.Fabric(accelerator="cpu", devices=1)
    if args.seed is not None:
        fabric.seed_everything(args.seed)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(48, 1, 8, 8, generator=g), torch.randint(0, 3, (48,), generator=g)
    )
    loader = DataLoader(data, batch_size=16, shuffle=False)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    for _ in range(args.epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            fabric.backward(loss)
            optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    run(parser.parse_args())
