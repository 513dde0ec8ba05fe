"""The corpus's cases: each pair of runs of a script in ``tests/e2e/corpus/``, the bug planted
between them and the verdict that bug calls for, derived from the bug (not from the tool)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import RandomSampler

CORPUS = Path(__file__).resolve().parent / "corpus"
CHAR_ARGS = ("--max-iters", "6")  # char_rnn.py: block 16, batch 8, seed 3407 (its defaults)


@dataclass(frozen=True)
class Run:
    """One recording: the command after ``--`` and the copy of the corpus it runs in."""

    command: tuple[str, ...]
    tree: str = "pristine"
    copy: int = 0  # a second recording of the same command (run A2)
    env: tuple[tuple[str, str], ...] = ()  # variables set for the recording


@dataclass(frozen=True)
class Expected:
    """The truth about a pair. ``None`` leaves a field unchecked (where nothing in the bug fixes
    it)."""

    identical: bool = False
    step: int | None = None
    phase: str | None = None
    layer: str | None = None
    cause: str | None = None
    rng: tuple[str, ...] | None = None
    flag: str | None = None  # a config verdict names the flag (or key) that differs
    reseeded_at: str | None = None  # a reseed's call site: the text of its line in the script


@dataclass(frozen=True)
class Case:
    name: str
    a: Run
    b: Run
    expected: Expected
    why: str
    wrong: str | None = None  # what the tool says instead, while it is wrong
    precondition_broken: str | None = None  # what the verdict claims that its records contradict
    extra: dict[str, Any] = field(default_factory=dict)
    ci: bool = False  # run by the README's test command; every case runs with --extended


def py(*args: str) -> tuple[str, ...]:
    return ("python", *args)


CASES = [
    Case(
        "classifier_gamma_flag",
        Run(py("mnist_classifier.py", "--epochs", "2")),
        Run(py("mnist_classifier.py", "--epochs", "2", "--gamma", "0.5")),
        Expected(step=6, phase="optimizer", cause="config", flag="--gamma"),
        "96 samples in batches of 16: 6 steps an epoch; StepLR lowers the lr after epoch 1, so "
        "Adadelta's update of "
        "step 6 (epoch 2's first) is the first to use 1.0*0.5 instead of 1.0*0.7; nothing else "
        "differs",
    ),
    Case(
        "vae_reseeded_after_sampling",
        Run(py("vae.py", "--epochs", "2")),
        Run(py("vae.py", "--epochs", "2", "--sample-seed", "-1")),
        Expected(
            step=5, phase="data", cause="rng_state", rng=("torch",), reseeded_at="torch.seed()"
        ),
        "80 samples in batches of 16: 5 steps an epoch; sample() calls torch.seed() after epoch "
        "1's evaluation, so "
        "epoch 2's shuffle, drawn from the global stream when its loader is iterated, is the first "
        "thing that differs",
    ),
    Case(
        "gan_generator_lr",
        Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7")),
        Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7", "--lrG", "0.0004")),
        Expected(step=0, phase="optimizer", cause="config", flag="--lrG"),
        "iteration 0 steps the discriminator's Adam (same lr) and then the generator's (0.0002 vs "
        "0.0004): the "
        "generator's first update is the first difference",
    ),
    Case(
        "gan_seed_flag_missing",
        Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7")),
        Run(py("dcgan.py", "--niter", "1")),
        Expected(step=0, phase="init", layer="netD.main.0", cause="config", flag="--manualSeed"),
        "without --manualSeed the script seeds torch from random.randint(1, 10000): the weights "
        "differ at init",
        ci=True,
    ),
    Case(
        "char_rnn_data_file_edited",
        Run(py("char_rnn.py", *CHAR_ARGS)),
        Run(py("char_rnn.py", *CHAR_ARGS), tree="edited_text"),
        Expected(step=2, phase="data", cause="data_content"),
        "run B's input.txt has one word reversed (same length, same characters, same vocabulary); "
        "the sampler is "
        "seeded, so the sample indices are equal and the first batch whose windows cover the word "
        "differs: the word is chosen to be "
        "first read by step 2",
    ),
    Case(
        "char_rnn_worker_count",
        Run(py("char_rnn.py", *CHAR_ARGS)),
        Run(py("char_rnn.py", *CHAR_ARGS, "--num-workers", "2")),
        Expected(identical=True),
        "the sampler has its own seeded generator and the dataset draws nothing: 4 or 2 workers "
        "load the same batches",
    ),
    Case(
        "seq2seq_worker_count",
        Run(py("seq2seq.py", "--epochs", "1")),
        Run(py("seq2seq.py", "--epochs", "1", "--workers", "2")),
        Expected(step=0, phase="data", cause="data_content"),
        "the dataset's token dropout draws from Python's random: in the main process (seeded by "
        "--seed) with 0 "
        "workers, in each worker (seeded by the loader's base seed) with 2; the shuffle is the "
        "same",
    ),
    Case(
        "regression_eval_draws_from_the_training_stream",
        Run(py("regression.py", "--steps", "6")),
        Run(py("regression.py", "--steps", "6", "--eval-every", "2")),
        Expected(step=2, phase="data", cause="config", flag="--eval-every"),
        "get_batch() draws from torch's global stream; with --eval-every 2 the evaluation after "
        "step 1 draws a batch "
        "of 256 from it, so step 2's training batch differs",
    ),
    Case(
        "random_split_seed_flag",
        Run(py("split_seeded.py", "--epochs", "1")),
        Run(py("split_seeded.py", "--epochs", "1", "--split-seed", "7")),
        Expected(step=0, phase="data", cause="config", flag="--split-seed"),
        "random_split's generator is seeded from --split-seed: another training subset from the "
        "first batch on "
        "(the loader's indices into the subset are the same)",
    ),
    Case(
        "numpy_split_unseeded",
        Run(py("tabular_numpy_split.py", "--epochs", "1")),
        Run(py("tabular_numpy_split.py", "--epochs", "1"), copy=1),
        Expected(step=0, phase="data", cause="rng_state", rng=("numpy",)),
        "set_seed() seeds random and torch, not NumPy; the hold-out split is "
        "np.random.permutation, so each run "
        "trains on other rows (standardised with other statistics) from the first batch",
    ),
    Case(
        "seed_defaults_to_a_random_value",
        Run(py("bow_sentiment.py", "--epochs", "1")),
        Run(py("bow_sentiment.py", "--epochs", "1"), copy=1),
        Expected(step=0, phase="init", cause="rng_state", rng=("python",)),
        "--seed defaults to random.randint(...), drawn from Python's stream, which nothing seeds: "
        "the same command parses a different seed, torch.manual_seed takes it and the weights "
        "differ at init; Python's stream seeded alike makes the two builds equal",
        extra={"config_key": "--seed"},
    ),
    Case(
        "config_file_edited",
        Run(py("config_train.py", "--config", "configs/base.json")),
        Run(py("config_train.py", "--config", "configs/base.json"), tree="edited_config"),
        Expected(step=0, phase="optimizer", cause="config", flag="weight_decay"),
        "run B's configs/base.json has weight_decay 0.05 instead of 0.01; AdamW's decay is applied "
        "in its first step",
    ),
    Case(
        "package_module_dropout_flag",
        Run(py("-m", "imgclf.train", "--epochs", "1")),
        Run(py("-m", "imgclf.train", "--epochs", "1", "--dropout", "0.3")),
        Expected(step=0, phase="forward", layer="drop", cause="config", flag="--dropout"),
        "the dropout probability is a flag of `python -m imgclf.train`: the first mask (and its "
        "scale) differs",
    ),
    Case(
        "accumulation_gradient_clipping_flag",
        Run(py("accumulate_ema.py", "--steps", "3")),
        Run(py("accumulate_ema.py", "--steps", "3", "--clip-grad", "0.5")),
        Expected(step=0, phase="optimizer", cause="config", flag="--clip-grad"),
        "two micro-batches accumulate the same gradients; their norm (about 370) is clipped to 0.5 "
        "before AdamW's first step in run B only",
    ),
]

CASES += [
    Case(
        "ngram_lists_hash_seed",
        Run(py("ngram_lists.py"), env=(("PYTHONHASHSEED", "0"),)),
        Run(py("ngram_lists.py"), env=(("PYTHONHASHSEED", "1"),)),
        Expected(step=0, phase="data", cause="environment", flag="PYTHONHASHSEED"),
        "no DataLoader: each step's input is a tensor built from a Python list of word ids, and "
        "the ids come from the order a set of words iterates in, which PYTHONHASHSEED decides; the "
        "weights are seeded alike, so step 0's input is the first thing that differs (its ids: "
        "[23, 30] with seed 0, [5, 38] with seed 1)",
        ci=True,
    ),
    Case(
        "lbfgs_closure_lr_flag",
        Run(py("lbfgs_sine.py", "--steps", "2")),
        Run(py("lbfgs_sine.py", "--steps", "2", "--lr", "0.5")),
        Expected(step=0, phase="optimizer", layer="lstm1", cause="config", flag="--lr"),
        "LBFGS's step(closure) runs the forward and backward passes up to 4 times, updating the "
        "weights between them: the first pass is the same in both runs, and the first update "
        "(its step size scaled by lr, 0.8 vs 0.5) is the first difference, before the second "
        "pass reads it",
        ci=True,
    ),
    Case(
        "prefetch_loader_worker_count",
        Run(py("prefetch_classifier.py", "--workers", "1")),
        Run(py("prefetch_classifier.py", "--workers", "2")),
        Expected(step=1, phase="data", cause="data_content"),
        "the loader's generator is seeded, so worker 0 starts from the same seed in both runs and "
        "loads batch 0 alike; batch 1 comes from worker 0 again with one worker, from worker 1 "
        "(another seed, other flips and crops) with two: the prefetcher takes batch 1 from the "
        "loader while step 0 trains, and step 1 is the first whose computation differs",
        extra={"config_key": "--workers"},
        ci=True,
    ),
    Case(
        "fabric_seed_flag_missing",
        Run(py("fabric_classifier.py", "--seed", "42")),
        Run(py("fabric_classifier.py")),
        Expected(step=0, phase="init", layer="conv1", cause="config", flag="--seed"),
        "seed_everything runs only with --seed: run B's weights are drawn from an unseeded torch "
        "stream, and Fabric names them _forward_module.conv1.weight, which is the model's conv1",
        ci=True,
    ),
    Case(
        "word_lm_saved_whole_dropout_flag",
        Run(py("word_lm_save.py")),
        Run(py("word_lm_save.py", "--dropout", "0.5")),
        Expected(step=0, phase="forward", layer="drop", cause="config", flag="--dropout"),
        "no optimizer (the weights are updated by hand) and no DataLoader; the first dropout mask "
        "(p 0.2 vs 0.5) is the first difference; the script pickles its whole model with "
        "torch.save after each epoch's evaluation",
        ci=True,
    ),
]

SAME_TWICE = {  # the same command recorded twice (run A2)
    "classifier": Run(py("mnist_classifier.py", "--epochs", "2")),
    "gan_with_two_optimizers_and_workers": Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7")),
    "package_module": Run(py("-m", "imgclf.train", "--epochs", "1")),
}


# --- run B's edited data file ---------------------------------------------------------------------


def window_batches(
    length: int, steps: int, block: int = 16, batch: int = 8, seed: int = 3407
) -> list[set[int]]:
    """The text positions each of char_rnn.py's first batches reads: its sampler, rebuilt with the
    same seed."""
    generator = torch.Generator().manual_seed(seed)
    sampler = iter(
        RandomSampler(
            range(length - block), replacement=True, num_samples=int(1e10), generator=generator
        )
    )
    batches = [[next(sampler) for _ in range(batch)] for _ in range(steps)]
    return [{p for start in starts for p in range(start, start + block + 1)} for starts in batches]


def reverse_a_word_first_read_at(text: str, step: int) -> tuple[str, int]:
    """``text`` with one word reversed whose changed characters are first read by batch ``step``."""
    covered = window_batches(len(text), step + 1)
    for match in re.finditer(r"[a-z]{4,}", text):
        word = match.group()
        changed = {match.start() + i for i in range(len(word)) if word[i] != word[::-1][i]}
        first = next((k for k, positions in enumerate(covered) if changed & positions), None)
        if first == step:
            return text[: match.start()] + word[::-1] + text[match.end() :], step
    raise AssertionError(f"no word of input.txt is first read at step {step}")


# --- the corpus's second set: shapes from the survey (QUIRKS.md) ---

CASES += [
    Case(
        "wgan_numpy_noise_unseeded",
        Run(py("wgan_critic.py", "--n_epochs", "1")),
        Run(py("wgan_critic.py", "--n_epochs", "1"), copy=1),
        Expected(step=0, phase="data", cause="rng_state", rng=("numpy",)),
        "torch is seeded, so the weights and the loader's shuffle are equal; the latent noise is "
        "np.random.normal, which nothing seeds: the generator's first input (step 0, before any "
        "update of either optimizer) is the first thing that differs",
    ),
    Case(
        "amp_autocast_dtype_flag",
        Run(py("amp_scaler.py", "--epochs", "1")),
        Run(py("amp_scaler.py", "--epochs", "1", "--amp-dtype", "float16")),
        Expected(step=0, phase="forward", layer="fc1", cause="config", flag="--amp-dtype"),
        "the batch and the weights are equal; under autocast fc1's output is bfloat16 in run A "
        "and float16 in run B, the first tensor to differ; run B's scaler then finds its first "
        "two steps' gradients overflowing and skips them (4 batches, 2 updates)",
    ),
    Case(
        "custom_optimizer_newton_schulz_steps",
        Run(py("custom_optimizer.py", "--num-iterations", "3")),
        Run(py("custom_optimizer.py", "--num-iterations", "3", "--ns-steps", "3")),
        Expected(step=0, phase="optimizer", layer="fc1", cause="config", flag="--ns-steps"),
        "the optimizer is a plain class whose step() updates the parameters in place; the batch, "
        "the forward and the gradients of step 0 are equal, and its update of fc1.weight (the "
        "first parameter it updates, orthogonalised by 5 vs 3 Newton-Schulz iterations) is the "
        "first difference",
    ),
    Case(
        "nanogpt_eval_interval_override",
        Run(py("nanogpt_configurator.py", "--max_iters=4")),
        Run(py("nanogpt_configurator.py", "--max_iters=4", "--eval_interval=2")),
        Expected(step=3, phase="data", cause="config", flag="eval_interval"),
        "the settings are module globals overridden by an exec'd configurator; both runs evaluate "
        "at iteration 0, run B also at iteration 2, drawing 8 batches from the torch.randint "
        "stream that get_batch() draws from; step 2 trains on the batch fetched during step 1, "
        "so step 3's batch (fetched after the evaluation) is the first thing that differs",
    ),
    Case(
        "infinite_loader_sampler_seed_flag",
        Run(py("infinite_loader.py", "--max-steps", "3", "--sampler-seed", "0")),
        Run(py("infinite_loader.py", "--max-steps", "3")),
        Expected(step=0, phase="data", cause="config", flag="--sampler-seed"),
        "batches come from .next() of a wrapper around a replacement sampler of 1e10 samples; "
        "with --sampler-seed the sampler has its own seeded generator, without it it seeds itself "
        "from torch's global stream when the wrapper first iterates it: the weights are equal and "
        "step 0's sample indices are the first thing that differs",
    ),
    Case(
        "peek_batch_show_flag",
        Run(py("peek_batch.py", "--epochs", "1")),
        Run(py("peek_batch.py", "--epochs", "1", "--show")),
        Expected(step=0, phase="data", cause="config", flag="--show"),
        "the network is built first, so the weights are equal; --show makes an iterator of the "
        "shuffling loader (whose shuffle seed comes from torch's global stream) and takes one "
        "batch to print, run A's first batch, so run B's training iterator draws the next seeds "
        "and step 0's sample order is the first thing that differs",
    ),
    Case(
        "dataparallel_lr_flag",
        Run(py("dataparallel_cnn.py", "--epochs", "1")),
        Run(py("dataparallel_cnn.py", "--epochs", "1", "--lr", "0.05")),
        Expected(step=0, phase="optimizer", layer="conv1", cause="config", flag="--lr"),
        "the network is wrapped in DataParallel (parameters named module.conv1.weight, ...); the "
        "batch, the forward and the gradients of step 0 are equal, and SGD's first update of "
        "conv1.weight (the first parameter, lr 0.1 vs 0.05) is the first difference",
    ),
    Case(
        "diffusion_helper_timesteps_flag",
        Run(py("diffusion_helper.py", "--train-num-steps", "3")),
        Run(py("diffusion_helper.py", "--train-num-steps", "3", "--timesteps", "50")),
        Expected(step=0, phase="data", cause="config", flag="--timesteps"),
        "the loop calls a diffusion helper, which draws t with torch.randint(0, timesteps) and "
        "the noise, then calls model(x_t, t): the loader's batch and the weights are equal, and "
        "the model's first inputs (t [76, 0, 67, ...] vs [26, 0, 17, ...], and x_t) are the "
        "first thing that differs",
    ),
    Case(
        "masked_autoencoder_mask_ratio_flag",
        Run(py("masked_autoencoder.py", "--epochs", "1")),
        Run(py("masked_autoencoder.py", "--epochs", "1", "--mask_ratio", "0.5")),
        Expected(step=0, phase="forward", cause="config", flag="--mask_ratio"),
        "the masking runs inside the model's forward: the batch, the weights and patch_embed's "
        "output are equal, the noise torch.rand draws is the same, and the patches kept (4 vs 8 "
        "of 16), made by the model's own code and first read by blocks.0, are the first thing "
        "that differs",
    ),
    Case(
        "reinforce_environment_unseeded",
        Run(py("reinforce_episodes.py", "--max-episodes", "3", "--env-seed", "543")),
        Run(py("reinforce_episodes.py", "--max-episodes", "3")),
        Expected(step=0, phase="data", cause="config", flag="--env-seed"),
        "one optimizer step per episode, one policy forward per environment step; torch is "
        "seeded alike, so the weights are equal, and the environment's own NumPy generator is "
        "seeded with 543 in run A and from entropy in run B: the start state, the policy's first "
        "input in step 0, is the first thing that differs",
    ),
    Case(
        "iterable_stream_worker_count",
        Run(py("iterable_stream.py", "--max-steps", "3", "--workers", "1")),
        Run(py("iterable_stream.py", "--max-steps", "3", "--workers", "2")),
        Expected(step=0, phase="data", cause="config", flag="--workers"),
        "an IterableDataset whose workers each keep every num_workers-th window of the stream: "
        "with one worker batch 0 holds windows 0-7, with two it holds worker 0's windows 0, 2, "
        "..., 14; the weights are equal and step 0's samples are the first thing that differs. "
        "No sample indices exist to tell order from content, so run B relaunched with --workers 1 "
        "is the proof that the worker count decides the batch",
    ),
    Case(
        "style_transfer_weight_flag",
        Run(py("style_transfer.py")),
        Run(py("style_transfer.py", "--style-weight", "1e5")),
        Expected(step=0, phase="forward", cause="config", flag="--style-weight"),
        "LBFGS trains the input image, no module's parameters: the frozen network's outputs and "
        "each loss module's term are equal at step 0, and the sum weighted outside any module, "
        "the loss backward() is called on, is the first thing that differs",
        ci=True,
    ),
    Case(
        "sampler_set_epoch_flag",
        Run(py("sampler_set_epoch.py", "2", "--reshuffle")),
        Run(py("sampler_set_epoch.py", "2")),
        Expected(step=3, phase="data", cause="config", flag="--reshuffle"),
        "48 samples in batches of 16: 3 steps an epoch; the DistributedSampler's order is drawn "
        "from seed + epoch, and only run A calls set_epoch: epoch 0's order is the same, epoch "
        "1's first batch (step 3) is the first thing that differs",
    ),
    Case(
        "ema_validation_weights_not_restored",
        Run(py("ema_validation.py", "--max-train-steps", "4")),
        Run(py("ema_validation.py", "--max-train-steps", "4", "--offload-ema")),
        Expected(step=2, phase="forward", layer="conv_in", cause="config", flag="--offload-ema"),
        "after step 1's update both runs swap the EMA copy's weights into the model to validate; "
        "run A restores the training weights, run B (--offload-ema) does not: step 2's batch is "
        "equal and its first forward output, conv_in's (computed with the EMA weights in run B), "
        "is the first tensor that differs",
    ),
]
