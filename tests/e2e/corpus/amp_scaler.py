"""A classifier trained under mixed precision in the shape of the AMP recipes: the forward and the
loss under ``torch.autocast``, the backward through a ``GradScaler``, the gradients unscaled before
clipping, and ``scaler.step`` calling the optimizer only when every gradient is finite (a step
with an overflow is skipped and the scale lowered).

``--amp-dtype`` picks the autocast dtype (bfloat16 or float16). The scale starts at 2**20: under
float16 the first two steps overflow and are skipped.
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    parser = argparse.ArgumentParser(description="mixed-precision training")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--amp-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--clip-grad", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class MLP(nn.Module):
    def __init__(self, in_features=24, hidden=64, classes=5):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.head(x)


def make_loader(batch_size):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 24, generator=g)
    y = (x[:, :5] * 3).argmax(1)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)


def train_one_epoch(model, loader, optimizer, scaler, args, amp_dtype):
    model.train()
    for x, y in loader:
        with torch.autocast("cpu", dtype=amp_dtype):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if args.clip_grad:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


def main():
    args = get_args()
    torch.manual_seed(args.seed)
    amp_dtype = getattr(torch, args.amp_dtype)
    loader = make_loader(args.batch_size)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    for epoch in range(args.epochs):
        start = time.time()
        loss = train_one_epoch(model, loader, optimizer, scaler, args, amp_dtype)
        print(
            f"epoch {epoch}: loss {loss:.4f}, scale {scaler.get_scale():g} "
            f"({time.time() - start:.2f}s)"
        )


if __name__ == "__main__":
    main()
