"""Deep convolutional GAN on 8x8 single-channel images.

Only the `fake` dataset is wired up here (random tensors), which is enough to exercise the
training loop: a discriminator step, then a generator step, every iteration.
"""

import argparse
import random

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", default="fake", help="fake")
parser.add_argument("--workers", type=int, help="number of data loading workers", default=2)
parser.add_argument("--batchSize", type=int, default=16, help="input batch size")
parser.add_argument("--nz", type=int, default=8, help="size of the latent z vector")
parser.add_argument("--ngf", type=int, default=16)
parser.add_argument("--ndf", type=int, default=16)
parser.add_argument("--niter", type=int, default=25, help="number of epochs to train for")
parser.add_argument("--lr", type=float, default=0.0002, help="learning rate, default=0.0002")
parser.add_argument(
    "--lrG", type=float, default=None, help="learning rate of the generator, default: --lr"
)
parser.add_argument("--beta1", type=float, default=0.5, help="beta1 for adam. default=0.5")
parser.add_argument("--manualSeed", type=int, help="manual seed")
opt = parser.parse_args()
print(opt)

if opt.manualSeed is None:
    opt.manualSeed = random.randint(1, 10000)
print("Random Seed: ", opt.manualSeed)
random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)

if opt.dataset != "fake":
    raise SystemExit(f"dataset {opt.dataset!r} is not available offline; use --dataset fake")
images = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
dataloader = DataLoader(
    TensorDataset(images), batch_size=opt.batchSize, shuffle=True, num_workers=opt.workers
)

device = torch.device("cpu")
nz, ngf, ndf = opt.nz, opt.ngf, opt.ndf


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


netG = Generator().to(device)
netG.apply(weights_init)
netD = Discriminator().to(device)
netD.apply(weights_init)

criterion = nn.BCELoss()
fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)
real_label, fake_label = 1.0, 0.0

optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lrG or opt.lr, betas=(opt.beta1, 0.999))

if __name__ == "__main__":
    for epoch in range(opt.niter):
        for i, data in enumerate(dataloader, 0):
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            real_cpu = data[0].to(device)
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label, device=device)
            output = netD(real_cpu)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()

            noise = torch.randn(batch_size, nz, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            errD = errD_real + errD_fake
            optimizerD.step()

            # (2) Update G network: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(real_label)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            optimizerG.step()
            print(
                f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D: {errD.item():.4f} Loss_G: "
                f"{errG.item():.4f} D(x): {D_x:.4f}"
            )
        with torch.no_grad():
            fake = netG(fixed_noise)
        print(f"epoch {epoch}: samples mean {fake.mean():.4f}")
