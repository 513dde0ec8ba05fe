"""A training script that keeps its own step counter, the way real loops do, and reseeds torch from
entropy when the counter reaches ``--reseed-at`` (a planted bug).

``--counter closure``: a helper made by a factory counts its calls in a closure dict;
``--counter global``: a module global ``iter_num`` counts the steps (nanoGPT's style);
``--counter enumerate``: the loop's own ``for it, batch in enumerate(recorder.batches())``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee

iter_num = 0


def make_maybe_reseed(at: int | None):
    count = {"n": 0}

    def maybe_reseed() -> None:
        if at is not None and count["n"] == at:
            torch.seed()
        count["n"] += 1

    return maybe_reseed


def main() -> None:
    global iter_num
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--counter", choices=["closure", "global", "enumerate"], required=True)
    parser.add_argument("--reseed-at", type=int, default=None)
    parser.add_argument("--steps", type=int, default=14)
    args = parser.parse_args()

    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(512, 8, generator=data), torch.randn(512, 1, generator=data)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    maybe_reseed = make_maybe_reseed(args.reseed_at)
    options = RecordOptions(steps=args.steps, every=5, checkpoint_every=5, force=True)
    with Recorder(
        args.out, Trainee(model, optimizer, loader), options, config=vars(args)
    ) as recorder:
        for it, (x, y) in enumerate(recorder.batches()):
            if args.counter == "closure":
                maybe_reseed()
            elif (iter_num if args.counter == "global" else it) == args.reseed_at:
                torch.seed()
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            recorder.log(loss)
            iter_num += 1


if __name__ == "__main__":
    main()
