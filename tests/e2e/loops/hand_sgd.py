"""A language-model loop in the style of the classic word-level examples: the corpus is one long
tensor, batches are sliced from it by index, and the weights are updated by hand
(``p.data.add_(p.grad, alpha=-lr)``), with no ``torch.optim`` optimizer. A layer centres its input
on the batch's mean, a reduction ATen splits across the intra-op threads, so ``--threads`` changes
its rounding on any CPU. The config records ``--out`` too, as ``config=vars(args)`` does.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from bisect_repro import Recorder, RecordOptions, Trainee


class Centre(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean()


class Model(nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.centre = Centre()
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.centre(self.embed(tokens)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--bptt", type=int, default=512)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    corpus = torch.randint(0, 200, (8 * 512 + 1, 64), generator=torch.Generator().manual_seed(1))
    batches = [
        (corpus[i : i + args.bptt], corpus[i + 1 : i + 1 + args.bptt])
        for i in range(0, len(corpus) - 1 - args.bptt + 1, args.bptt)
    ]
    model = Model(200, 256)
    criterion = nn.CrossEntropyLoss()
    options = RecordOptions(steps=len(batches), every=2, checkpoint_every=4, force=True)
    with Recorder(args.out, Trainee(model, None, batches), options, config=vars(args)) as recorder:
        for source, target in recorder.batches():
            model.zero_grad()
            loss = criterion(model(source).view(-1, 200), target.reshape(-1))
            loss.backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-args.lr)
            recorder.log(loss)


if __name__ == "__main__":
    main()
