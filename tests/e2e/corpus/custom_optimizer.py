"""A small MLP trained with a hand-written optimizer in the shape of the speedrun scripts: the
optimizer is a plain class, not a ``torch.optim.Optimizer``, with its own ``step()`` that updates
the parameters in place. Matrices get momentum orthogonalised by a Newton-Schulz iteration;
vectors (the biases) get an Adam update, applied on odd steps only. Batches come from a Python
generator, not a DataLoader.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def zeropower_via_newtonschulz5(G, steps):
    """An approximate orthogonalisation of G by a quintic Newton-Schulz iteration."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G / (G.norm() + 1e-7)
    transposed = G.size(0) > G.size(1)
    if transposed:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if transposed:
        X = X.T
    return X


class MuonWithAdam:
    """Orthogonalised momentum for 2-D parameters, Adam (every other step) for the rest."""

    def __init__(self, params, lr=0.02, momentum=0.95, ns_steps=5, adam_lr=3e-3):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.ns_steps, self.adam_lr = lr, momentum, ns_steps, adam_lr
        self.state = {p: {"momentum_buffer": torch.zeros_like(p)} for p in self.params}
        for p in self.params:
            if p.ndim < 2:
                self.state[p]["exp_avg"] = torch.zeros_like(p)
                self.state[p]["exp_avg_sq"] = torch.zeros_like(p)
        self.steps = 0

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self):
        self.steps += 1
        for p in self.params:
            if p.grad is None:
                continue
            state = self.state[p]
            if p.ndim >= 2:
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - self.momentum)
                update = p.grad.lerp(buf, self.momentum)
                update = zeropower_via_newtonschulz5(update, self.ns_steps)
                p.add_(update, alpha=-self.lr * max(1, p.size(0) / p.size(1)) ** 0.5)
            elif self.steps % 2 == 0:
                state["exp_avg"].lerp_(p.grad, 0.1)
                state["exp_avg_sq"].lerp_(p.grad.square(), 0.05)
                t = self.steps // 2
                denom = (state["exp_avg_sq"] / (1 - 0.95**t)).sqrt().add_(1e-8)
                p.addcdiv_(state["exp_avg"], denom, value=-self.adam_lr / (1 - 0.9**t))


class MLP(nn.Module):
    def __init__(self, dim=16, hidden=48, classes=6):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


def data_generator(batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 6, generator=g)
    while True:
        x = torch.randn(batch_size, 16, generator=g)
        yield x, (x @ w).argmax(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-iterations", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.95)
    parser.add_argument("--ns-steps", type=int, default=5, help="Newton-Schulz iterations")
    parser.add_argument("--cooldown-frac", type=float, default=0.4)
    args = parser.parse_args()
    torch.manual_seed(0)

    model = MLP()
    optimizer = MuonWithAdam(
        model.parameters(), lr=args.lr, momentum=args.momentum, ns_steps=args.ns_steps
    )
    train_loader = data_generator(args.batch_size, seed=1)

    def get_lr_scale(step):
        x = step / args.num_iterations
        if x < 1 - args.cooldown_frac:
            return 1.0
        return (1 - x) / args.cooldown_frac

    for step in range(args.num_iterations):
        inputs, targets = next(train_loader)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.lr = args.lr * get_lr_scale(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 2 == 0 or step == args.num_iterations - 1:
            print(f"step:{step}/{args.num_iterations} train_loss:{loss.item():.4f}")
    assert math.isfinite(loss.item())


if __name__ == "__main__":
    main()
