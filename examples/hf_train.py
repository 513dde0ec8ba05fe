"""A Hugging Face Trainer script recorded with the bisect-repro callback: a tiny GPT-2 built from a
config (nothing is downloaded), trained on random tokens.

    python examples/hf_train.py --out runs/a
    python examples/hf_train.py --out runs/b --reseed-at 7    # torch.seed() in compute_loss
    bisect-repro compare runs/a runs/b

    python examples/hf_train.py --out runs/a --save-every 10       # also leaves out/checkpoint-10
    python examples/hf_train.py --out runs/resumed --resume out/checkpoint-10
    bisect-repro compare runs/a runs/resumed                       # is the resume exact?
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

from bisect_repro.integrations.transformers import BisectRepro


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int = 256, length: int = 12) -> None:
        data = torch.Generator().manual_seed(1)
        self.tokens = torch.randint(0, 64, (count, length), generator=data)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class LoggingTrainer(Trainer):
    """A Trainer whose loss helper reseeds torch at one step, as a logging helper might."""

    reseed_at: int | None = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        if self.reseed_at is not None and self.state.global_step == self.reseed_at:
            torch.seed()
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the run directory to record")
    parser.add_argument(
        "--steps", type=int, default=20, help="optimizer steps (TrainingArguments.max_steps)"
    )
    planted = parser.add_argument_group("planted bug")
    planted.add_argument(
        "--reseed-at", type=int, default=None, help="compute_loss calls torch.seed() at this step"
    )
    parser.add_argument(
        "--accumulate", type=int, default=1, help="batches per step (gradient_accumulation_steps)"
    )
    parser.add_argument(
        "--save-every",
        type=int,
        default=0,
        help="also save a Trainer checkpoint every this many steps",
    )
    parser.add_argument("--resume", default=None, help="a Trainer checkpoint folder to resume from")
    parser.add_argument(
        "--output-dir", default="out", help="the Trainer's own output folder, for its checkpoints"
    )
    args = parser.parse_args()

    set_seed(0)  # before the model is built: Trainer seeds only when it is created, after
    config = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=1e-3,
        optim="adamw_torch",
        logging_steps=1000,
        save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500,
        report_to="none",
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = LoggingTrainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=Tokens(),
        callbacks=[BisectRepro(args.out, every=5, checkpoint_every=10)],
    )
    trainer.reseed_at = args.reseed_at
    trainer.train(resume_from_checkpoint=args.resume)


if __name__ == "__main__":
    main()
