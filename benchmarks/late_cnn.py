"""The recipe of the late-divergence compare benchmark: a ~2M-parameter CNN whose runs part late.

A small convolutional network (three conv blocks and a wide classifier, about 2.2M parameters)
on random CIFAR-sized images (3x32x32, ten classes), batch 32, SGD with momentum, dropout in the
classifier. Torch is seeded; at step ``reseed_at`` (counted by the scheduler, whose state
checkpoints restore) the step reseeds torch's stream from entropy (``torch.seed()``), as a stray
``torch.seed()`` in a training loop would: two runs match up to that step and part in its
dropout. Recorded for 200 steps with snapshots every 10 and checkpoints every 50, the runs part
at step 170, between checkpoints 150 and 200.

The same training three ways, for :mod:`benchmarks.compare_late`: a recipe, a loop of its own
under the Recorder API, and an unchanged script:

    bisect-repro record benchmarks/late_cnn.py:build --steps 200 --every 10 --checkpoint-every 50 \\
        --out A
    python benchmarks/late_cnn.py --recorder --out A
    bisect-repro record --every 10 --checkpoint-every 50 --out A -- python benchmarks/late_cnn.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee


def network(width: int = 1024) -> nn.Module:
    def block(a: int, b: int) -> list[nn.Module]:
        return [nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(
        *block(3, 32),
        *block(32, 64),
        *block(64, 128),
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, width),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(width, 10),
    )


def build(reseed_at: int = 170, batch: int = 32, width: int = 1024) -> Trainee:
    torch.manual_seed(0)
    model = network(width)
    data = torch.Generator().manual_seed(1)
    images, labels = (
        torch.randn(batch * 32, 3, 32, 32, generator=data),
        torch.randint(0, 10, (batch * 32,), generator=data),
    )
    loader = DataLoader(
        TensorDataset(images, labels),
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainee = Trainee.supervised(
        model, optimizer, loader, nn.functional.cross_entropy, scheduler=scheduler
    )
    usual = trainee.step
    assert usual is not None

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if scheduler.last_epoch == reseed_at:
            torch.seed()  # the planted bug: torch's stream reseeded from entropy
        return usual(batch)

    trainee.step = step
    return trainee


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="the late-divergence CNN as a script: a plain loop, or under the Recorder"
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reseed-at", type=int, default=170)
    parser.add_argument(
        "--recorder", action="store_true", help="record with the Recorder API into --out"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    args = parser.parse_args(argv)
    trainee = build(args.reseed_at)
    assert trainee.step is not None
    if args.recorder:
        options = RecordOptions(
            steps=args.steps, every=args.every, checkpoint_every=args.checkpoint_every, force=True
        )
        with Recorder(args.out, trainee, options, config={"reseed_at": args.reseed_at}) as recorder:
            for batch in recorder.batches():
                recorder.log(trainee.step(batch))
        return
    done = 0
    while done < args.steps:
        for batch in trainee.loader:
            trainee.step(batch)
            done += 1
            if done == args.steps:
                break


if __name__ == "__main__":
    main()
