"""The loop counters each framework's callback hands a replay's rewind: kept, moved by a step, put
back."""

from __future__ import annotations

import pytest


def test_lightning_puts_back_its_progress_and_keeps_the_loaders_last_batch_flag() -> None:
    pytest.importorskip("lightning")
    import lightning

    from bisect_repro.integrations.lightning import _LoopCounters

    trainer = lightning.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    counters, epoch_loop = _LoopCounters(trainer), trainer.fit_loop.epoch_loop
    epoch_loop.batch_progress.increment_ready()
    kept = counters.state_dict()
    for _ in range(3):  # a step ran, and the next batch was drawn, the epoch's last
        epoch_loop.automatic_optimization.optim_progress.optimizer.step.increment_completed()
        epoch_loop.batch_progress.increment_ready()
        epoch_loop._batches_that_stepped += 1
    epoch_loop.batch_progress.is_last_batch = True
    moved = counters.position()
    assert trainer.global_step == 3 and moved != kept
    counters.load_state_dict(kept)
    assert (
        trainer.global_step == 0
        and epoch_loop.batch_idx == 0
        and epoch_loop._batches_that_stepped == 0
    )
    assert counters.position() == {**kept, "batch": {**kept["batch"], "is_last_batch": True}}
    assert epoch_loop.batch_progress.is_last_batch  # as the loader left it


def test_transformers_puts_back_its_step_and_epoch_and_stands_by_step_and_epochs_begun() -> None:
    pytest.importorskip("transformers")
    from transformers import TrainerState

    from bisect_repro.integrations.transformers import _LoopCounters

    state = TrainerState(global_step=7, epoch=0.25)
    counters = _LoopCounters(state)
    kept, at = counters.state_dict(), counters.position()
    state.global_step, state.epoch, counters.epochs = 8, 0.3, 1
    assert counters.position() != at
    counters.load_state_dict(kept)
    assert (state.global_step, state.epoch) == (7, 0.25) and counters.position() == (7, 1)
    # the Trainer draws a step's micro-batches before it begins
    assert not counters.draws_during_step
