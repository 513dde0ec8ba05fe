"""A small training library in the style of minGPT's: the loop lives in ``Trainer.run``, and the
user's script hooks into it with callbacks."""

import torch
from torch.utils.data import DataLoader

from bisect_repro import Recorder, RecordOptions, Trainee


class Trainer:
    def __init__(self, model, dataset, max_iters=10, batch_size=16, lr=1e-2):
        self.model, self.dataset = model, dataset
        self.max_iters, self.batch_size, self.lr = max_iters, batch_size, lr
        self.callbacks = {"on_batch_end": []}
        self.iter_num = 0

    def add_callback(self, event, callback):
        self.callbacks[event].append(callback)

    def run(self):
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr)
        loader = DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)
        recorder = Recorder("run", Trainee(self.model, optimizer, loader), RecordOptions(steps=self.max_iters, every=2))
        batches = recorder.batches()
        self.model.train()
        while self.iter_num < self.max_iters:
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.model.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            for callback in self.callbacks["on_batch_end"]:
                callback(self)
            self.iter_num += 1
        recorder.close()
