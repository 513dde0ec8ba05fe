"""Train a small residual network on 16x16 colour images in the shape of the popular CIFAR-10
training repositories: random crops and flips in the dataset, the network wrapped in
``torch.nn.DataParallel`` (its parameters are then named ``module.*``), SGD with momentum and
weight decay under a cosine schedule stepped per epoch, a test pass after each epoch and a
checkpoint whenever the test accuracy improves.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser(description="CIFAR-style training")
parser.add_argument("--lr", default=0.1, type=float, help="learning rate")
parser.add_argument("--resume", "-r", action="store_true", help="resume from checkpoint")
parser.add_argument("--epochs", default=200, type=int)
args = parser.parse_args()

torch.manual_seed(0)
best_acc = 0  # best test accuracy
start_epoch = 0  # start from epoch 0 or last checkpoint epoch


class RandomCropFlipImages(Dataset):
    def __init__(self, n, seed, train):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.rand(n, 3, 16, 16, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.train = train

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = (self.images[i] - 0.5) / 0.25
        if self.train:  # RandomCrop(16, padding=2) and RandomHorizontalFlip
            padded = F.pad(img, (2, 2, 2, 2))
            top, left = torch.randint(0, 5, (2,)).tolist()
            img = padded[:, top : top + 16, left : left + 16]
            if torch.rand(1) < 0.5:
                img = img.flip(-1)
        return img, int(self.labels[i])


print("==> Preparing data..")
trainloader = DataLoader(RandomCropFlipImages(48, 1, True), batch_size=16, shuffle=True)
testloader = DataLoader(RandomCropFlipImages(16, 2, False), batch_size=16, shuffle=False)


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetTiny(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = BasicBlock(8, 8)
        self.layer2 = BasicBlock(8, 16, stride=2)
        self.linear = nn.Linear(16, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer2(self.layer1(out))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


print("==> Building model..")
net = ResNetTiny()
net = torch.nn.DataParallel(net)  # runs the module itself where no GPU is visible

if args.resume:
    print("==> Resuming from checkpoint..")
    checkpoint = torch.load("./checkpoint/ckpt.pth")
    net.load_state_dict(checkpoint["net"])
    best_acc = checkpoint["acc"]
    start_epoch = checkpoint["epoch"]

criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200)


def train(epoch):
    print(f"\nEpoch: {epoch}")
    net.train()
    train_loss, correct, total = 0, 0, 0
    for batch_idx, (inputs, targets) in enumerate(trainloader):
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()

        train_loss += loss.item()
        total += targets.size(0)
        correct += outputs.argmax(1).eq(targets).sum().item()
        print(
            f"{batch_idx + 1}/{len(trainloader)} Loss: {train_loss / (batch_idx + 1):.3f} "
            f"| Acc: {100.0 * correct / total:.3f}% ({correct}/{total})"
        )


def test(epoch):
    global best_acc
    net.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for inputs, targets in testloader:
            outputs = net(inputs)
            total += targets.size(0)
            correct += outputs.argmax(1).eq(targets).sum().item()
    acc = 100.0 * correct / total
    if acc > best_acc:
        print("Saving..")
        state = {"net": net.state_dict(), "acc": acc, "epoch": epoch}
        os.makedirs("checkpoint", exist_ok=True)
        torch.save(state, "./checkpoint/ckpt.pth")
        best_acc = acc


for epoch in range(start_epoch, start_epoch + args.epochs):
    train(epoch)
    test(epoch)
    scheduler.step()
