"""Synthetic 3x8x8 "textures": each class is a stripe orientation, with random flips."""

import numpy as np
import torch
from torch.utils.data import Dataset


class Textures(Dataset):
    def __init__(self, n, train=True):
        rs = np.random.RandomState(0 if train else 1)
        self.labels = rs.randint(0, 4, size=n)
        base = np.stack(
            [np.sin(np.arange(8)[:, None] * (k + 1) + np.arange(8)[None, :] * k) for k in range(4)]
        )
        self.images = (base[self.labels][:, None] + 0.2 * rs.normal(size=(n, 3, 8, 8))).astype(
            np.float32
        )
        self.train = train

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        image = self.images[i]
        if self.train and np.random.rand() < 0.5:
            image = image[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image)), int(self.labels[i])
