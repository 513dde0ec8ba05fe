"""A script whose training loop lives in a library (``trainer.Trainer.run``), hooked by a callback;
``--reseed-at N`` plants a bug: the callback reseeds torch from entropy after iteration N."""

import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainer import Trainer

parser = argparse.ArgumentParser()
parser.add_argument("--reseed-at", type=int, default=None)
args = parser.parse_args()
torch.manual_seed(0)
data = torch.Generator().manual_seed(0)
dataset = TensorDataset(torch.randn(256, 8, generator=data), torch.randn(256, 1, generator=data))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
trainer = Trainer(model, dataset)


def on_batch_end(trainer):
    if trainer.iter_num == args.reseed_at:
        torch.seed()


trainer.add_callback("on_batch_end", on_batch_end)
trainer.run()
