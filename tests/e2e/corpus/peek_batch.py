"""Training an image classifier in the shape of the beginners' CIFAR-10 tutorial, as module-level
code: define a small CNN, load the images through a shuffling DataLoader, optionally look at one
batch first (``iter(trainloader)`` and ``next``), then train with SGD and momentum, printing the
running loss.

The loader has no generator of its own: each iterator it makes seeds its shuffle from torch's
global stream.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--show", action="store_true", help="print one batch of training images")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
classes = ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


########################################################################
# 1. Define a Convolutional Neural Network


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)  # flatten all dimensions except batch
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


net = Net()

########################################################################
# 2. Load and normalize the training images (16x16 RGB, made up here)


class TinyImages(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.rand(n, 3, 16, 16, generator=g)
        self.targets = torch.randint(0, len(classes), (n,), generator=g).tolist()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        img = (self.data[index] - 0.5) / 0.5  # Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        return img, self.targets[index]


trainset = TinyImages(24, seed=1)
trainloader = DataLoader(trainset, batch_size=args.batch_size, shuffle=True, num_workers=0)


def imshow(img):
    img = img / 2 + 0.5  # unnormalize
    print(f"image grid {tuple(img.shape)}, mean {img.mean():.3f}, range {img.min():.2f}..")


if args.show:
    # get some random training images
    dataiter = iter(trainloader)
    images, labels = next(dataiter)
    imshow(torch.cat(list(images), dim=2))
    print(" ".join(f"{classes[labels[j]]:5s}" for j in range(args.batch_size)))

########################################################################
# 3. Define a Loss function and optimizer

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=0.001, momentum=0.9)

########################################################################
# 4. Train the network

for epoch in range(args.epochs):  # loop over the dataset multiple times
    running_loss = 0.0
    for i, data in enumerate(trainloader, 0):
        # get the inputs; data is a list of [inputs, labels]
        inputs, labels = data

        # zero the parameter gradients
        optimizer.zero_grad()

        # forward + backward + optimize
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()

        # print statistics
        running_loss += loss.item()
        if i % 2 == 1:  # print every 2 mini-batches
            print(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / 2:.3f}")
            running_loss = 0.0

print("Finished Training")
