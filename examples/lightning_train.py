"""A Lightning training script recorded with the bisect-repro callback.

python examples/lightning_train.py --out runs/a
python examples/lightning_train.py --out runs/b --reseed-at 7        # torch.seed() in training_step
at step 7 bisect-repro compare runs/a runs/b

python examples/lightning_train.py --out runs/first --steps 10 --save ckpt.ckpt   # stop at 10 with
a checkpoint python examples/lightning_train.py --out runs/resumed --resume ckpt.ckpt         #
resume it to 20 bisect-repro compare runs/a runs/resumed                                          #
what the resume missed
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro.integrations.lightning import BisectRepro


class Regressor(L.LightningModule):
    def __init__(
        self, lr: float = 1e-2, reseed_at: int | None = None, weigh_by_batch_idx: bool = False
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.hparams.reseed_at is not None and self.global_step == self.hparams.reseed_at:
            torch.seed()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        return loss * (1 + 0.01 * batch_idx) if self.hparams.weigh_by_batch_idx else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the run directory to record")
    parser.add_argument(
        "--steps", type=int, default=20, help="optimizer steps (the Trainer's max_steps)"
    )
    parser.add_argument(
        "--reseed-at", type=int, default=None, help="training_step calls torch.seed() at this step"
    )
    parser.add_argument(
        "--weigh-by-batch-idx",
        action="store_true",
        help="training_step scales its loss by the batch_idx it is given",
    )
    parser.add_argument(
        "--accumulate", type=int, default=1, help="batches per step (accumulate_grad_batches)"
    )
    parser.add_argument(
        "--save", default=None, help="save a Lightning checkpoint to this file when training ends"
    )
    parser.add_argument(
        "--resume", default=None, help="a Lightning checkpoint to resume from (ckpt_path)"
    )
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    data = torch.Generator().manual_seed(1)
    dataset = TensorDataset(
        torch.randn(512, 16, generator=data), torch.randn(512, 1, generator=data)
    )
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=args.accumulate,
        callbacks=[BisectRepro(args.out, every=5, checkpoint_every=10)],
    )
    trainer.fit(
        Regressor(reseed_at=args.reseed_at, weigh_by_batch_idx=args.weigh_by_batch_idx),
        loader,
        ckpt_path=args.resume,
    )
    if args.save:
        trainer.save_checkpoint(args.save)


if __name__ == "__main__":
    main()
