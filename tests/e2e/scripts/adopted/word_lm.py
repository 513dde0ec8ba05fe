"""A word-level language model trained the way the classic example does, knowing nothing of
bisect-repro: the corpus is one long tensor, batches are sliced from it by index, and the weights
are updated by hand (``p.data.add_(p.grad, alpha=-lr)``), with no ``torch.optim`` optimizer. A
layer centres its input on the batch mean, a reduction ATen splits across the intra-op threads,
so ``--threads`` changes its rounding on any CPU."""

import argparse

import torch
from torch import nn

from bisect_repro import Recorder, Trainee

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.5)
parser.add_argument("--bptt", type=int, default=512)
args = parser.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
corpus = torch.randint(0, 200, (6 * 512 + 1, 64), generator=torch.Generator().manual_seed(1))


class Centre(nn.Module):
    def forward(self, x):
        return x - x.mean()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(200, 256)
        self.centre = Centre()
        self.head = nn.Linear(256, 200)

    def forward(self, tokens):
        return self.head(self.centre(self.embed(tokens)))


model = Model()
criterion = nn.CrossEntropyLoss()
recorder = Recorder("run", Trainee(model, None, range(0, corpus.size(0) - 1 - args.bptt + 1, args.bptt)))
for i in recorder.batches():
    source, target = corpus[i : i + args.bptt], corpus[i + 1 : i + 1 + args.bptt]
    model.zero_grad()
    loss = criterion(model(source).view(-1, 200), target.reshape(-1))
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-args.lr)
print(f"loss {loss.item():.4f}")
