"""A training script that stops and resumes from its own checkpoint, knowing nothing of
bisect-repro: an MLP with dropout, Adam, a DataLoader shuffling from its own seeded generator
(its iterators seed from another), and noise added to each batch from torch's global stream.

``--stop-after K`` stops after K iterations and writes ``--checkpoint``, holding the model, the
iteration number and what ``--save`` names (``optimizer``, ``rng``: torch's global stream,
``data``: the sampler generator's state at the epoch's start and the batches taken since, which
a resumed epoch skips);
``--resume`` loads it and goes on to ``--iters``, restoring what it holds.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=12)
parser.add_argument("--stop-after", type=int, default=None)
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--save", default="optimizer,rng,data")
parser.add_argument("--resume", action="store_true")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(args.seed)
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
generator = torch.Generator().manual_seed(2)


class Skipping:
    """Batches of a batch sampler, less the first ``skip`` of the next pass (a resumed epoch)."""

    def __init__(self, inner):
        self.inner, self.skip = inner, 0

    def __iter__(self):
        batches = iter(self.inner)
        for _ in range(self.skip):
            next(batches)
        self.skip = 0
        yield from batches

    def __len__(self):
        return len(self.inner) - self.skip


sampler = Skipping(BatchSampler(RandomSampler(data, generator=generator), 8, drop_last=False))
# an iterator draws its base seed from this generator, not from torch's global stream
loader = DataLoader(data, batch_sampler=sampler, generator=torch.Generator().manual_seed(3))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

iteration, taken, epoch_start = 0, 0, generator.get_state()
if args.resume:
    checkpoint = torch.load(args.checkpoint, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    iteration = checkpoint["iteration"]
    if "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    if "rng" in checkpoint:
        torch.set_rng_state(checkpoint["rng"])
    if "data" in checkpoint:
        epoch_start, taken = checkpoint["data"]
        generator.set_state(epoch_start)


def save():
    saved = {"model": model.state_dict(), "iteration": iteration}
    if "optimizer" in args.save:
        saved["optimizer"] = optimizer.state_dict()
    if "rng" in args.save:
        saved["rng"] = torch.get_rng_state()
    if "data" in args.save:
        saved["data"] = (epoch_start, taken)
    torch.save(saved, args.checkpoint)


while iteration < args.iters:
    sampler.skip = taken  # the batches this epoch took before the checkpoint
    for x, y in loader:
        x = x + 0.1 * torch.randn_like(x)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iteration += 1
        taken += 1
        if iteration == args.stop_after:
            save()
            raise SystemExit(0)
        if iteration == args.iters:
            break
    taken, epoch_start = 0, generator.get_state()
