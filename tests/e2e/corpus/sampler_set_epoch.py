"""A regression model trained in the shape of the multi-GPU tutorials, on one process: a Trainer
class with ``_run_batch`` and ``_run_epoch``, positional arguments for the epoch count and batch
size, and a ``DistributedSampler`` (one replica, rank 0, shuffled from its own seed) feeding the
DataLoader.

The sampler's order is drawn from its seed plus its epoch, which only ``set_epoch`` changes; the
script calls it only with ``--reshuffle``.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(3)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, reshuffle):
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.reshuffle = reshuffle

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        if self.reshuffle:
            self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
        print(f"Epoch {epoch} | last loss {loss:.5f}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def prepare_dataloader(dataset, batch_size, seed):
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
    return DataLoader(
        dataset, batch_size=batch_size, pin_memory=False, shuffle=False, sampler=sampler
    )


def main(total_epochs, batch_size, reshuffle, seed):
    torch.manual_seed(seed)
    dataset = MyTrainDataset(48)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    train_data = prepare_dataloader(dataset, batch_size, seed)
    Trainer(model, train_data, optimizer, reshuffle).train(total_epochs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed-style training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument(
        "--batch_size", default=16, type=int, help="Input batch size on each device"
    )
    parser.add_argument("--reshuffle", action="store_true", help="call sampler.set_epoch(epoch)")
    parser.add_argument("--seed", default=0, type=int)
    args = parser.parse_args()
    main(args.total_epochs, args.batch_size, args.reshuffle, args.seed)
