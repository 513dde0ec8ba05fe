"""A denoising diffusion model trained in the shape of the DDPM codebases: the model is never
called by the training loop itself but by a ``GaussianDiffusion`` helper, whose
``training_losses`` samples a timestep per image and Gaussian noise from torch's stream, noises
the batch to ``x_t`` and calls ``model(x_t, t)`` to predict the noise. Batches come from a
DataLoader cycled forever by a generator; the loop counts optimizer steps.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def cycle(dl):
    while True:
        yield from dl


def extract(a, t, x_shape):
    out = a.gather(-1, t)
    return out.reshape(t.shape[0], *((1,) * (len(x_shape) - 1)))


class GaussianDiffusion:
    def __init__(self, timesteps=1000, beta_start=1e-4, beta_end=0.02):
        betas = torch.linspace(beta_start, beta_end, timesteps, dtype=torch.float64)
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        self.num_timesteps = timesteps
        self.sqrt_alphas_cumprod = alphas_cumprod.sqrt().float()
        self.sqrt_one_minus_alphas_cumprod = (1.0 - alphas_cumprod).sqrt().float()

    def q_sample(self, x_start, t, noise):
        return (
            extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
            + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise
        )

    def training_losses(self, model, x_start):
        t = torch.randint(0, self.num_timesteps, (x_start.shape[0],))
        noise = torch.randn_like(x_start)
        x_t = self.q_sample(x_start, t, noise)
        return F.mse_loss(model(x_t, t), noise)


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, t):
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half) * -(math.log(10000) / (half - 1)))
        args = t.float()[:, None] * freqs[None]
        return torch.cat((args.sin(), args.cos()), dim=-1)


class Denoiser(nn.Module):
    def __init__(self, channels=1, dim=16):
        super().__init__()
        self.time_mlp = nn.Sequential(
            SinusoidalPosEmb(dim), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim)
        )
        self.init_conv = nn.Conv2d(channels, dim, 3, padding=1)
        self.mid_conv = nn.Conv2d(dim, dim, 3, padding=1)
        self.final_conv = nn.Conv2d(dim, channels, 1)

    def forward(self, x, time):
        emb = self.time_mlp(time)[:, :, None, None]
        h = F.silu(self.init_conv(x) + emb)
        h = F.silu(self.mid_conv(h))
        return self.final_conv(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--timesteps", type=int, default=100)
    parser.add_argument("--train-num-steps", type=int, default=1000)
    parser.add_argument("--train-batch-size", type=int, default=8)
    parser.add_argument("--train-lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    g = torch.Generator().manual_seed(10)
    images = torch.tanh(torch.randn(64, 1, 8, 8, generator=g))  # in [-1, 1]
    dl = cycle(DataLoader(TensorDataset(images), batch_size=args.train_batch_size, shuffle=True))

    model = Denoiser()
    diffusion = GaussianDiffusion(timesteps=args.timesteps)
    opt = torch.optim.Adam(model.parameters(), lr=args.train_lr, betas=(0.9, 0.99))

    step = 0
    while step < args.train_num_steps:
        (data,) = next(dl)
        loss = diffusion.training_losses(model, data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")
        step += 1


if __name__ == "__main__":
    main()
