"""A variational autoencoder on 64-pixel binary-ish images, with an evaluation pass and a grid of
samples decoded after every epoch."""

import argparse

import torch
from torch import nn, optim
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="VAE example")
parser.add_argument(
    "--batch-size",
    type=int,
    default=16,
    metavar="N",
    help="input batch size for training (default: 16)",
)
parser.add_argument(
    "--epochs", type=int, default=10, metavar="N", help="number of epochs to train (default: 10)"
)
parser.add_argument("--seed", type=int, default=1, metavar="S", help="random seed (default: 1)")
parser.add_argument("--latent", type=int, default=4, help="size of the latent code")
parser.add_argument(
    "--log-interval",
    type=int,
    default=2,
    metavar="N",
    help="how many batches to wait before logging training status",
)
parser.add_argument(
    "--sample-seed",
    type=int,
    default=0,
    help="seed of the sample grid; -1 draws a new grid every epoch",
)
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cpu")


def blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(n, 2, generator=g) * 8
    ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    d = (ys[None] - centres[:, :1, None]) ** 2 + (xs[None] - centres[:, 1:, None]) ** 2
    return TensorDataset(torch.exp(-d / 4).reshape(n, 64), torch.zeros(n))


train_loader = DataLoader(blobs(80, 0), batch_size=args.batch_size, shuffle=True)
test_loader = DataLoader(blobs(32, 1), batch_size=args.batch_size, shuffle=False)


class VAE(nn.Module):
    def __init__(self, latent):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, latent)
        self.fc22 = nn.Linear(32, latent)
        self.fc3 = nn.Linear(latent, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


model = VAE(args.latent).to(device)
optimizer = optim.Adam(model.parameters(), lr=1e-3)


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def train(epoch):
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} "
                f"[{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: "
                f"{loss.item() / len(data):.6f}"
            )
    print(f"====> Epoch: {epoch} Average loss: {train_loss / len(train_loader.dataset):.4f}")


def test(epoch):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for data, _ in test_loader:
            data = data.to(device)
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()
    print(f"====> Test set loss: {test_loss / len(test_loader.dataset):.4f}")


def sample(epoch):
    with torch.no_grad():
        if args.sample_seed < 0:
            torch.seed()  # a fresh grid every epoch
            z = torch.randn(16, args.latent)
        else:
            z = torch.randn(
                16, args.latent, generator=torch.Generator().manual_seed(args.sample_seed)
            )
        grid = model.decode(z.to(device)).cpu()
    print(f"====> Samples of epoch {epoch}: mean {grid.mean():.4f}")


if __name__ == "__main__":
    for epoch in range(1, args.epochs + 1):
        train(epoch)
        test(epoch)
        sample(epoch)
