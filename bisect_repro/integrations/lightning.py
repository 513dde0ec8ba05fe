"""Lightning: record a ``lightning.Trainer`` run with one callback, and replay it with ``compare``.

    from bisect_repro.integrations.lightning import BisectRepro

    recorder = BisectRepro("runs/a", every=10, checkpoint_every=50)
    trainer = lightning.Trainer(..., callbacks=[recorder])

A step is one optimizer update (``trainer.global_step``): with ``accumulate_grad_batches=k`` it
spans k batches, each noted, and its loss is the last one ``training_step`` returned. The
callback captures the model, the first optimizer and its first LR scheduler, every global random
stream (those ``seed_everything`` seeds included) and the streams inside the train data loader
(its generator, its sampler's); the config holds the module's ``hparams`` and the Trainer's
settings, the environment the precision, the accumulation count and the devices.

``compare`` replays such a run by running its script again (the callback then serves the
replay instead of recording) from the script's own start: step 0, or the step a Lightning
checkpoint (``trainer.fit(..., ckpt_path=...)``) resumes from, so that a resumed run is replayed
from its resume and compared with the uninterrupted one. Its repeats of a step rewind that process,
with the fit loop's counters put back (:mod:`bisect_repro.serve.framework_rewind`).

Where the guarantees stop: one optimizer and one scheduler are captured; a rewound step's first
batch is handed the next batch's ``batch_idx`` (a step that reads it is repeated in fresh
processes); a run resumed from a Lightning checkpoint replays only while that checkpoint file is
where it was; the data order is known by the batches' contents, not by sample indices.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from ..record.recorder import FrameworkRecorder, RecordOptions
from ._common import loader_streams, start_recorder

__all__ = ["BisectRepro"]


class _LoopCounters:
    """The counters of a ``Trainer``'s fit loop a step reads or moves (``global_step``, the batch
    progress that decides accumulation and schedulers, the epoch), kept and put back by a replay's
    rewind (:mod:`bisect_repro.serve.framework_rewind`); the loop's ``is_last_batch`` stays as the
    loader left it."""

    draws_during_step = True  # Lightning draws each micro-batch once the one before has run

    def __init__(self, trainer: Any) -> None:
        self.fit_loop = trainer.fit_loop

    def _progress(self) -> dict[str, Any]:
        epoch_loop = self.fit_loop.epoch_loop
        return {
            "batch": epoch_loop.batch_progress,
            "optimizer": epoch_loop.automatic_optimization.optim_progress,
            "manual": epoch_loop.manual_optimization.optim_step_progress,
            "epoch": self.fit_loop.epoch_progress,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **{name: progress.state_dict() for name, progress in self._progress().items()},
            "stepped": self.fit_loop.epoch_loop._batches_that_stepped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        last = self.fit_loop.epoch_loop.batch_progress.is_last_batch
        for name, progress in self._progress().items():
            progress.load_state_dict(copy.deepcopy(state[name]))
        self.fit_loop.epoch_loop.batch_progress.is_last_batch = last
        self.fit_loop.epoch_loop._batches_that_stepped = state["stepped"]

    def position(self) -> Any:
        return self.state_dict()


class BisectRepro(Callback):
    """Records a ``lightning.Trainer`` fit into a bisect-repro run directory (see the module
    docstring)."""

    def __init__(
        self,
        out: str | Path,
        *,
        every: int = 10,
        checkpoint_every: int | None = 100,
        force: bool = True,
    ) -> None:
        super().__init__()
        self.out = Path(out)
        self.options = RecordOptions(every=every, checkpoint_every=checkpoint_every, force=force)
        self.recorder: FrameworkRecorder | None = None
        self._step_open = False

    @property
    def state_key(self) -> str:
        # unique per run directory: two callbacks never share checkpoint state
        return f"BisectRepro[{self.out}]"

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizer = trainer.optimizers[0]
        schedulers = trainer.lr_scheduler_configs
        loaders = trainer.train_dataloader
        loaders = (
            list(loaders.values())
            if isinstance(loaders, dict)
            else list(loaders)
            if isinstance(loaders, (list, tuple))
            else [loaders]
        )
        config = {
            **dict(getattr(pl_module, "hparams", {}) or {}),
            "trainer.max_steps": trainer.max_steps,
            "trainer.max_epochs": trainer.max_epochs,
            "trainer.accumulate_grad_batches": trainer.accumulate_grad_batches,
            "trainer.gradient_clip_val": trainer.gradient_clip_val,
        }
        environment = {
            "framework": f"lightning {lightning.__version__}",
            "framework.precision": str(trainer.precision),
            "framework.accumulate_grad_batches": trainer.accumulate_grad_batches,
            "framework.devices": f"{trainer.num_devices} x {type(trainer.accelerator).__name__}",
            "framework.strategy": type(trainer.strategy).__name__,
        }
        self.recorder = start_recorder(
            self.out,
            model=pl_module,
            optimizer=optimizer,
            scheduler=schedulers[0].scheduler if schedulers else None,
            streams=loader_streams(loader for loader in loaders if loader is not None),
            options=self.options,
            steps=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
            config=config,
            environment=environment,
            start_step=trainer.global_step,
        )
        self.recorder.follow_loop(_LoopCounters(trainer))

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.recorder is None:
            return
        if not self._step_open:
            self.recorder.begin_step()
            self._step_open = True
        self.recorder.note_batch(batch)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.recorder is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.recorder.log(loss)
        if trainer.global_step > self.recorder.step:  # the optimizer stepped: the step is done
            self.recorder.end_step()
            self._step_open = False

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
