"""Small transformer-free sequence regressor trained with gradient accumulation, gradient
clipping, a warm-up then cosine learning-rate schedule, and an exponential moving average of the
weights that is used for evaluation."""

import argparse
import copy
import math

import torch
from torch import nn


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accum-steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--clip-grad", type=float, default=0.0, help="max gradient norm (0: no clipping)"
    )
    parser.add_argument("--ema-decay", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=123)
    return parser.parse_args()


class ConvRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 5, padding=2)
        self.act = nn.GELU()
        self.pool = nn.AdaptiveMaxPool1d(1)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.pool(self.act(self.conv(x.unsqueeze(1)))).squeeze(-1))


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def update_ema(ema, model, decay):
    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
        e.mul_(decay).add_(p, alpha=1 - decay)


def main():
    args = get_args()
    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    model = ConvRegressor()
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        for _ in range(args.accum_steps):
            x = torch.randn(args.micro_batch, 32, generator=data_gen)
            y = 20 * x.abs().amax(1, keepdim=True) + 10
            loss = nn.functional.mse_loss(model(x), y) / args.accum_steps
            loss.backward()
        if args.clip_grad > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        else:
            norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        update_ema(ema, model, args.ema_decay)
        with torch.no_grad():
            x = torch.randn(64, 32, generator=data_gen)
            val = nn.functional.mse_loss(ema(x), 20 * x.abs().amax(1, keepdim=True) + 10)
        print(
            f"step {step}: loss {loss.item() * args.accum_steps:.4f} grad norm {norm:.3f} ema val "
            f"{val.item():.4f}"
        )


if __name__ == "__main__":
    main()
