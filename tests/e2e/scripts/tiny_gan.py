"""A tiny GAN in the style of the classic DCGAN example, knowing nothing of bisect-repro: a
generator and a discriminator, each with its own Adam, stepped one after the other every
iteration, on a fake dataset. ``--lr-g`` sets the generator's learning rate (a planted bug: run B
doubles it); ``--late-optimizer`` makes a third optimizer after training has begun."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.main(noise)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.main(images).view(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr-g", type=float, default=0.002)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--late-optimizer", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(1)
    data = TensorDataset(torch.randn(48, 8, generator=torch.Generator().manual_seed(0)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    netG, netD = Generator(), Discriminator()
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=0.002, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=args.lr_g, betas=(0.5, 0.999))
    done = 0
    while done < args.iterations:
        for (real,) in loader:
            netD.zero_grad()
            errD_real = criterion(netD(real), torch.ones(real.size(0)))
            errD_real.backward()
            noise = torch.randn(real.size(0), 4)
            fake = netG(noise)
            errD_fake = criterion(netD(fake.detach()), torch.zeros(real.size(0)))
            errD_fake.backward()
            optimizerD.step()
            netG.zero_grad()
            errG = criterion(netD(fake), torch.ones(real.size(0)))
            errG.backward()
            optimizerG.step()
            done += 1
            if args.late_optimizer and done == 2:
                torch.optim.SGD(netG.parameters(), lr=0.1)
            if done == args.iterations:
                break
        print(
            f"{done} iterations: loss D {(errD_real + errD_fake).item():.4f}, loss G "
            f"{errG.item():.4f}"
        )


if __name__ == "__main__":
    main()
