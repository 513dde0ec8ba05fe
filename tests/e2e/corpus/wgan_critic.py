"""Wasserstein GAN with gradient penalty on 8x8 single-channel images, written as one module-level
script: the critic is stepped on every batch and the generator only every ``n_critic`` batches;
the critic's loss adds a gradient penalty on points between real and generated images, whose
gradient is taken with ``autograd.grad(create_graph=True)``.

torch is seeded with ``--seed``; the latent noise and the interpolation weights come from NumPy,
which nothing seeds.
"""

import argparse

import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--n_epochs", type=int, default=200, help="number of epochs of training")
parser.add_argument("--batch_size", type=int, default=16, help="size of the batches")
parser.add_argument("--lr", type=float, default=0.0002, help="adam: learning rate")
parser.add_argument("--b1", type=float, default=0.5, help="adam: decay of first order momentum")
parser.add_argument("--b2", type=float, default=0.999, help="adam: decay of second order momentum")
parser.add_argument("--latent_dim", type=int, default=8, help="dimensionality of the latent space")
parser.add_argument("--img_size", type=int, default=8, help="size of each image dimension")
parser.add_argument("--n_critic", type=int, default=5, help="critic steps per generator step")
parser.add_argument("--lambda_gp", type=float, default=10.0, help="gradient penalty weight")
parser.add_argument("--seed", type=int, default=0)
opt = parser.parse_args()
print(opt)

torch.manual_seed(opt.seed)
img_shape = (1, opt.img_size, opt.img_size)
n_pixels = int(np.prod(img_shape))


class Generator(nn.Module):
    def __init__(self):
        super().__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(opt.latent_dim, 32, normalize=False),
            *block(32, 64),
            nn.Linear(64, n_pixels),
            nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        return img.view(img.shape[0], *img_shape)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(n_pixels, 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, 1),
        )

    def forward(self, img):
        return self.model(img.view(img.shape[0], -1))


generator = Generator()
discriminator = Discriminator()

# "real" images: a fixed set of blurred blobs in [-1, 1]
g = torch.Generator().manual_seed(1234)
real = torch.nn.functional.avg_pool2d(torch.randn(96, *img_shape, generator=g), 3, 1, 1)
real = (real / real.abs().amax()).clamp(-1, 1)
dataloader = DataLoader(TensorDataset(real), batch_size=opt.batch_size, shuffle=True)

optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))


def compute_gradient_penalty(D, real_samples, fake_samples):
    """The penalty on the critic's gradient norm at random points between real and fake."""
    alpha = torch.Tensor(np.random.random((real_samples.size(0), 1, 1, 1)))
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = torch.ones(real_samples.shape[0], 1)
    gradients = autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=fake,
        create_graph=True,
        retain_graph=True,
        only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


batches_done = 0
for epoch in range(opt.n_epochs):
    for i, (imgs,) in enumerate(dataloader):
        real_imgs = imgs

        # ---------------------
        #  Train the critic
        # ---------------------
        optimizer_D.zero_grad()
        z = torch.Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim)))
        fake_imgs = generator(z)
        real_validity = discriminator(real_imgs)
        fake_validity = discriminator(fake_imgs)
        gradient_penalty = compute_gradient_penalty(discriminator, real_imgs.data, fake_imgs.data)
        d_loss = (
            -torch.mean(real_validity)
            + torch.mean(fake_validity)
            + opt.lambda_gp * gradient_penalty
        )
        d_loss.backward()
        optimizer_D.step()

        optimizer_G.zero_grad()

        # Train the generator every n_critic steps
        if i % opt.n_critic == 0:
            fake_imgs = generator(z)
            fake_validity = discriminator(fake_imgs)
            g_loss = -torch.mean(fake_validity)
            g_loss.backward()
            optimizer_G.step()

            print(
                f"[Epoch {epoch}/{opt.n_epochs}] [Batch {i}/{len(dataloader)}] "
                f"[D loss: {d_loss.item():.4f}] [G loss: {g_loss.item():.4f}]"
            )
            batches_done += opt.n_critic
