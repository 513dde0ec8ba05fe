"""Train a small residual MLP whose every setting, the seed included, comes from a JSON config.

python config_train.py --config configs/base.json
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ResidualBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.ff(self.norm(x)))


class ResMLP(nn.Module):
    def __init__(self, features, hidden, layers):
        super().__init__()
        self.stem = nn.Linear(features, hidden)
        self.blocks = nn.Sequential(*[ResidualBlock(hidden) for _ in range(layers)])
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def build_data(cfg):
    g = torch.Generator().manual_seed(cfg["seed"])
    x = torch.randn(cfg["samples"], cfg["features"], generator=g)
    y = torch.sin(x.sum(1, keepdim=True))
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, help="path to a JSON config")
    args = parser.parse_args()
    with open(args.config) as f:
        cfg = json.load(f)
    print(json.dumps(cfg))
    torch.manual_seed(cfg["seed"])

    loader = DataLoader(
        build_data({**cfg["data"], "seed": cfg["seed"]}), batch_size=cfg["batch_size"], shuffle=True
    )
    model = ResMLP(cfg["data"]["features"], **cfg["model"])
    opt_cfg = cfg["optimizer"]
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=opt_cfg["lr"],
        weight_decay=opt_cfg["weight_decay"],
        betas=tuple(opt_cfg["betas"]),
    )
    for epoch in range(cfg["epochs"]):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.5f}")


if __name__ == "__main__":
    main()
