"""A training script with its own loop, recorded with the Recorder API: ``python own_loop.py``.

    python examples/own_loop.py --out runs/a
    python examples/own_loop.py --out runs/b --reseed-at 9     # torch reseeded at step 9
    bisect-repro compare runs/a runs/b                         # replays both scripts, unchanged

``--nondeterministic`` looks embeddings up with ``table[idx]`` on two threads (its backward
accumulates with ``index_put_``); ``--unseeded-shuffle`` drops the loader's generator.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Recorder, RecordOptions, Trainee


class Model(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 16, lookup: bool = False) -> None:
        super().__init__()
        self.lookup = lookup
        self.table = nn.Parameter(torch.randn(vocab, width) * 0.1)
        self.body = nn.Sequential(
            nn.Linear(width, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = (
            self.table[tokens] if self.lookup else nn.functional.embedding(tokens, self.table)
        )
        return self.body(embedded.mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the run directory to record")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument(
        "--every",
        type=int,
        default=5,
        help="snapshot every this many steps, checkpoint every twice as many",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds Python, NumPy, torch and the loader's shuffle"
    )
    parser.add_argument(
        "--reseed-at", type=int, default=None, help="reseed torch from entropy at this step"
    )
    parser.add_argument(
        "--nondeterministic",
        action="store_true",
        help="look embeddings up with table[idx] on two threads",
    )
    parser.add_argument(
        "--unseeded-shuffle",
        action="store_true",
        help="shuffle from torch's stream, reseeded from entropy",
    )
    args = parser.parse_args()

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    data = torch.Generator().manual_seed(1)
    tokens, targets = (
        torch.randint(0, 1000, (2048, 64), generator=data),
        torch.randn(2048, 1, generator=data),
    )
    model = Model(lookup=args.nondeterministic)
    generator = None if args.unseeded_shuffle else torch.Generator().manual_seed(args.seed)
    if args.unseeded_shuffle:
        # as a library that reseeds on import would: the loader shuffles from torch's stream
        torch.seed()
    loader = DataLoader(
        TensorDataset(tokens, targets), batch_size=512, shuffle=True, generator=generator
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    options = RecordOptions(
        steps=args.steps, every=args.every, checkpoint_every=args.every * 2, force=True
    )
    with Recorder(
        args.out, Trainee(model, optimizer, loader), options, config=vars(args)
    ) as recorder:
        for batch in recorder.batches():
            if args.reseed_at is not None and recorder.step == args.reseed_at:
                torch.seed()
            x, y = batch
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            recorder.log(loss)
    if not recorder.replaying:
        print(f"recorded {args.out}")


if __name__ == "__main__":
    main()
