"""Regression on a tabular dataset held in NumPy arrays, with a shuffled hold-out split.

The rows are shuffled with NumPy before the hold-out rows are cut off; features are
standardised with the training rows' statistics.
"""

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)


def load_table(rows=100, cols=6):
    rs = np.random.RandomState(5)
    x = rs.normal(size=(rows, cols)).astype(np.float32)
    y = (x @ rs.normal(size=(cols,)) + 0.1 * rs.normal(size=rows)).astype(np.float32)
    return x, y


def train_test_split(x, y, test_size):
    perm = np.random.permutation(len(x))
    cut = int(len(x) * (1 - test_size))
    return x[perm[:cut]], x[perm[cut:]], y[perm[:cut]], y[perm[cut:]]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--test-size", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    set_seed(args.seed)

    x, y = load_table()
    x_train, x_test, y_train, y_test = train_test_split(x, y, args.test_size)
    mean, std = x_train.mean(0), x_train.std(0)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    train_loader = DataLoader(
        TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
        batch_size=args.batch_size,
        shuffle=True,
    )

    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for xb, yb in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            test_loss = nn.functional.mse_loss(
                model(torch.from_numpy(x_test)).squeeze(1), torch.from_numpy(y_test)
            )
        print(f"epoch {epoch}: train {loss.item():.4f} test {test_loss.item():.4f}")


if __name__ == "__main__":
    main()
