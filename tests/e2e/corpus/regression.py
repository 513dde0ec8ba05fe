"""Fit a degree-4 polynomial with a single linear layer on polynomial features.

No DataLoader: every step draws a fresh batch of points. The parameters are updated by hand.
"""

import argparse

import torch
import torch.nn.functional as F

POLY_DEGREE = 4


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, POLY_DEGREE + 1)], 1)


class PolyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(POLY_DEGREE, 1)

    def forward(self, x):
        return self.fc(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="report the loss on a fresh batch every N steps (0: never)",
    )
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    w_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5

    def f(x):
        return x.mm(w_target) + b_target.item()

    def get_batch(batch_size=args.batch_size):
        random = torch.randn(batch_size)
        x = make_features(random)
        return x, f(x)

    model = PolyNet()
    for step in range(args.steps):
        batch_x, batch_y = get_batch()
        model.zero_grad()
        output = F.smooth_l1_loss(model(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in model.parameters():
            param.data.add_(-args.lr * param.grad)
        if args.eval_every and (step + 1) % args.eval_every == 0:
            with torch.no_grad():
                x, y = get_batch(256)
                print(f"step {step}: eval loss {F.smooth_l1_loss(model(x), y).item():.6f}")
    print(f"Loss: {loss:.6f} after {args.steps} batches")


if __name__ == "__main__":
    main()
