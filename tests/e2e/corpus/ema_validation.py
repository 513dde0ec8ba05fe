"""A small denoising network trained in the shape of the diffusers training scripts: an EMA of the
model kept as a ``copy.deepcopy`` and updated after every optimizer step, and a validation every
``--validation-steps`` steps that runs on the EMA weights by swapping them into the live model
(store the training weights, copy the EMA in, validate, restore).

With ``--offload-ema`` the EMA copy is moved to the CPU after each validation, and in that branch
the training weights are never restored: training goes on from the EMA weights.
"""

import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class EMAModel:
    """An exponential moving average of a model, held as a deep copy of it."""

    def __init__(self, model, decay=0.999, min_decay=0.0):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay, self.min_decay = decay, min_decay
        self.optimization_step = 0
        self.temp_stored_params = None

    def get_decay(self, step):
        return max(self.min_decay, min(self.decay, (1 + step) / (10 + step)))

    @torch.no_grad()
    def step(self, model):
        self.optimization_step += 1
        one_minus_decay = 1 - self.get_decay(self.optimization_step)
        for s_param, param in zip(self.module.parameters(), model.parameters(), strict=True):
            s_param.sub_(one_minus_decay * (s_param - param))

    def store(self, parameters):
        self.temp_stored_params = [param.detach().cpu().clone() for param in parameters]

    def copy_to(self, parameters):
        for s_param, param in zip(self.module.parameters(), parameters, strict=True):
            param.data.copy_(s_param.data)

    def restore(self, parameters):
        for c_param, param in zip(self.temp_stored_params, parameters, strict=True):
            param.data.copy_(c_param.data)
        self.temp_stored_params = None

    def to(self, device):
        self.module.to(device)


class Denoiser(nn.Module):
    def __init__(self, channels=1, width=8):
        super().__init__()
        self.conv_in = nn.Conv2d(channels, width, 3, padding=1)
        self.conv_mid = nn.Conv2d(width, width, 3, padding=1)
        self.conv_out = nn.Conv2d(width, channels, 3, padding=1)

    def forward(self, x):
        h = F.silu(self.conv_in(x))
        h = F.silu(self.conv_mid(h))
        return x - self.conv_out(h)


@torch.no_grad()
def log_validation(model, images, sigma, step):
    model.eval()
    g = torch.Generator().manual_seed(0)  # the same noise at every validation
    noisy = images + sigma * torch.randn(images.shape, generator=g)
    loss = F.mse_loss(model(noisy), images).item()
    model.train()
    print(f"step {step}: validation loss {loss:.5f}")


def parse_args():
    parser = argparse.ArgumentParser(description="denoiser training with EMA validation")
    parser.add_argument("--train-batch-size", type=int, default=8)
    parser.add_argument("--max-train-steps", type=int, default=1000)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--sigma", type=float, default=0.3)
    parser.add_argument("--use-ema", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--offload-ema", action="store_true", help="keep the EMA on the CPU")
    parser.add_argument("--ema-decay", type=float, default=0.99)
    parser.add_argument("--validation-steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(1)
    clean = F.avg_pool2d(torch.rand(80, 1, 8, 8, generator=g), 3, 1, 1)
    train_dataloader = DataLoader(
        TensorDataset(clean[:64]), batch_size=args.train_batch_size, shuffle=True
    )
    val_images = clean[64:]

    model = Denoiser()
    ema_model = EMAModel(model, decay=args.ema_decay) if args.use_ema else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    global_step = 0
    while global_step < args.max_train_steps:
        for (batch,) in train_dataloader:
            noisy = batch + args.sigma * torch.randn_like(batch)
            loss = F.mse_loss(model(noisy), batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if args.use_ema:
                ema_model.step(model)
            global_step += 1
            print(f"step {global_step}: loss {loss.item():.5f}")

            if global_step % args.validation_steps == 0:
                if args.use_ema:
                    # keep the training weights aside and validate with the EMA weights
                    ema_model.store(model.parameters())
                    ema_model.copy_to(model.parameters())
                log_validation(model, val_images, args.sigma, global_step)
                if args.use_ema:
                    if args.offload_ema:
                        ema_model.to("cpu")
                    else:
                        ema_model.restore(model.parameters())
            if global_step >= args.max_train_steps:
                break


if __name__ == "__main__":
    main()
