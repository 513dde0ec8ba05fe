"""Masked-autoencoder pre-training in the shape of the MAE reference code: images are cut into
patches, a random subset of them is kept inside the model's ``forward`` (per-sample noise from
``torch.rand``, sorted), the encoder sees only the kept patches, the decoder restores the order
with mask tokens and the loss is taken on the masked patches only. The learning rate is set by
hand every iteration (warm-up, then half-cycle cosine) from a base rate scaled by the batch size.
"""

import argparse
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def sincos_pos_embed(embed_dim, grid_size, cls_token=False):
    """Fixed 2-D sine-cosine position embeddings, [grid_size * grid_size (+1), embed_dim]."""
    coords = torch.stack(
        torch.meshgrid(torch.arange(grid_size), torch.arange(grid_size), indexing="xy")
    ).reshape(2, -1)
    omega = 1.0 / 10000 ** (torch.arange(embed_dim // 4) / (embed_dim / 4))
    out = [f(c[:, None].float() * omega[None]) for c in coords for f in (torch.sin, torch.cos)]
    emb = torch.cat(out, dim=1)
    if cls_token:
        emb = torch.cat([torch.zeros(1, embed_dim), emb], dim=0)
    return emb


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=2.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim)
        )

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class MaskedAutoencoderViT(nn.Module):
    def __init__(self, img_size=8, patch_size=2, in_chans=1, embed_dim=16, decoder_dim=16):
        super().__init__()
        self.patch_size = patch_size
        num_patches = (img_size // patch_size) ** 2
        grid = img_size // patch_size
        # encoder
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(
            sincos_pos_embed(embed_dim, grid, cls_token=True)[None], requires_grad=False
        )
        self.blocks = nn.ModuleList([Block(embed_dim, 2)])
        self.norm = nn.LayerNorm(embed_dim)
        # decoder
        self.decoder_embed = nn.Linear(embed_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        self.decoder_pos_embed = nn.Parameter(
            sincos_pos_embed(decoder_dim, grid, cls_token=True)[None], requires_grad=False
        )
        self.decoder_blocks = nn.ModuleList([Block(decoder_dim, 2)])
        self.decoder_norm = nn.LayerNorm(decoder_dim)
        self.decoder_pred = nn.Linear(decoder_dim, patch_size**2 * in_chans)
        assert self.pos_embed.shape[1] == num_patches + 1
        torch.nn.init.normal_(self.cls_token, std=0.02)
        torch.nn.init.normal_(self.mask_token, std=0.02)

    def patchify(self, imgs):
        p = self.patch_size
        n, c, h, w = imgs.shape
        x = imgs.reshape(n, c, h // p, p, w // p, p)
        return torch.einsum("nchpwq->nhwpqc", x).reshape(n, (h // p) * (w // p), p * p * c)

    def random_masking(self, x, mask_ratio):
        """Keeps a random (1 - mask_ratio) of the patches of each sample, by sorting noise."""
        N, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        noise = torch.rand(N, L)
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L])
        mask[:, :len_keep] = 0
        return x_masked, torch.gather(mask, dim=1, index=ids_restore), ids_restore

    def forward_encoder(self, x, mask_ratio):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = x + self.pos_embed[:, 1:, :]
        x, mask, ids_restore = self.random_masking(x, mask_ratio)
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        x = torch.cat((cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x, ids_restore):
        x = self.decoder_embed(x)
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        index = ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2])
        x = torch.cat([x[:, :1, :], torch.gather(x_, dim=1, index=index)], dim=1)
        x = x + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:, :]

    def forward_loss(self, imgs, pred, mask):
        loss = ((pred - self.patchify(imgs)) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum()  # mean loss on removed patches

    def forward(self, imgs, mask_ratio=0.75):
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(imgs, pred, mask), pred, mask


def adjust_learning_rate(optimizer, epoch, args):
    """Warm-up, then a half-cycle cosine, written into every param group."""
    if epoch < args.warmup_epochs:
        lr = args.lr * epoch / args.warmup_epochs
    else:
        progress = (epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs)
        lr = args.min_lr + (args.lr - args.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    return lr


def train_one_epoch(model, data_loader, optimizer, epoch, args):
    model.train(True)
    optimizer.zero_grad()
    for data_iter_step, (samples,) in enumerate(data_loader):
        if data_iter_step % args.accum_iter == 0:
            adjust_learning_rate(optimizer, data_iter_step / len(data_loader) + epoch, args)
        loss, _, _ = model(samples, mask_ratio=args.mask_ratio)
        (loss / args.accum_iter).backward()
        if (data_iter_step + 1) % args.accum_iter == 0:
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch} iter {data_iter_step}: loss {loss.item():.4f}")


def get_args_parser():
    parser = argparse.ArgumentParser("MAE pre-training", add_help=False)
    parser.add_argument("--batch_size", default=8, type=int)
    parser.add_argument("--epochs", default=400, type=int)
    parser.add_argument("--accum_iter", default=1, type=int)
    parser.add_argument("--mask_ratio", default=0.75, type=float, help="share of patches removed")
    parser.add_argument("--weight_decay", type=float, default=0.05)
    parser.add_argument("--lr", type=float, default=None, help="absolute learning rate")
    parser.add_argument("--blr", type=float, default=1e-3, help="base lr: lr = blr * batch / 256")
    parser.add_argument("--min_lr", type=float, default=0.0)
    parser.add_argument("--warmup_epochs", type=int, default=1)
    parser.add_argument("--seed", default=0, type=int)
    return parser


def main(args):
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(5)
    images = torch.rand(32, 1, 8, 8, generator=g)
    data_loader_train = DataLoader(
        TensorDataset(images), batch_size=args.batch_size, shuffle=True, drop_last=True
    )
    model = MaskedAutoencoderViT()
    eff_batch_size = args.batch_size * args.accum_iter
    if args.lr is None:
        args.lr = args.blr * eff_batch_size / 256
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim <= 1]
    param_groups = [
        {"params": no_decay, "weight_decay": 0.0},
        {"params": decay, "weight_decay": args.weight_decay},
    ]
    optimizer = torch.optim.AdamW(param_groups, lr=args.lr, betas=(0.9, 0.95))
    for epoch in range(args.epochs):
        train_one_epoch(model, data_loader_train, optimizer, epoch, args)


if __name__ == "__main__":
    main(get_args_parser().parse_args())
