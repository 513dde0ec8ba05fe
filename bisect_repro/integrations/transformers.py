"""Hugging Face ``transformers``: record a ``Trainer`` run with one callback, and replay it with
``compare``.

    from bisect_repro.integrations.transformers import BisectRepro

    recorder = BisectRepro("runs/a", every=10, checkpoint_every=50)
    trainer = transformers.Trainer(..., callbacks=[recorder])

A step is one optimizer update (``state.global_step``): with ``gradient_accumulation_steps=k``
it spans k batches, each noted, and its loss is the last one the model returned. The callback
captures the model, the optimizer (unwrapped from accelerate's) and the LR scheduler, every global
random stream (those ``set_seed`` seeds included) and the streams inside the train data loader
(accelerate's seedable sampler's generator among them); the config holds the
``TrainingArguments``, the environment the precision, the accumulation count and the device.
The batches and the loss are read with hooks on the model's forward in training mode (the
callback events carry neither), so evaluation during training is not noted.

``compare`` replays such a run by running its script again (the callback then serves the replay)
from the script's own start: step 0, or the checkpoint ``trainer.train(resume_from_checkpoint=...)``
resumes from, so that a resumed run is compared with the uninterrupted one from its resume on.
Its repeats of a step rewind that process, with ``state.global_step`` and ``state.epoch`` put back
(:mod:`bisect_repro.serve.framework_rewind`).

Where the guarantees stop: the loss is the model output's ``loss`` (a model that returns none, or
a ``compute_loss`` of one's own, logs no loss; the batches and the state still are compared); a
resumed run replays only while its checkpoint folder is where it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import TrainerCallback

from ..record.recorder import FrameworkRecorder, RecordOptions
from ._common import loader_streams, start_recorder

__all__ = ["BisectRepro"]


class _LoopCounters:
    """The counters of a ``Trainer``'s state a step reads or moves (``global_step``, ``epoch``),
    kept and put back by a replay's rewind (:mod:`bisect_repro.serve.framework_rewind`). The loop's
    ``epoch`` moves with a count of its own: where it stands is the step count and the epochs
    begun."""

    draws_during_step = False  # the Trainer draws a step's micro-batches before the step begins

    def __init__(self, state: Any) -> None:
        self.state = state
        self.epochs = 0
        """The epochs the Trainer has begun (the callback counts them)."""

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.state.global_step, "epoch": self.state.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.global_step, self.state.epoch = state["global_step"], state["epoch"]

    def position(self) -> Any:
        return self.state.global_step, self.epochs


class BisectRepro(TrainerCallback):
    """Records a ``transformers.Trainer`` run into a bisect-repro run directory (see the module
    docstring)."""

    def __init__(
        self,
        out: str | Path,
        *,
        every: int = 10,
        checkpoint_every: int | None = 100,
        force: bool = True,
    ) -> None:
        self.out = Path(out)
        self.options = RecordOptions(every=every, checkpoint_every=checkpoint_every, force=force)
        self.recorder: FrameworkRecorder | None = None
        self._handles: list[Any] = []
        self._counters: _LoopCounters | None = None

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        *,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
        environment = {
            "framework": f"transformers {transformers.__version__}",
            "framework.precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            "framework.gradient_accumulation_steps": args.gradient_accumulation_steps,
            "framework.device": str(args.device),
            "framework.n_gpu": args.n_gpu,
        }
        self.recorder = start_recorder(
            self.out,
            model=model,
            optimizer=inner,
            scheduler=lr_scheduler,
            streams=loader_streams([train_dataloader] if train_dataloader is not None else []),
            options=self.options,
            steps=state.max_steps or None,
            config={f"args.{k}": v for k, v in args.to_dict().items()},
            environment=environment,
            start_step=state.global_step,
        )
        self._counters = _LoopCounters(state)
        self.recorder.follow_loop(self._counters)
        self._handles = [
            model.register_forward_pre_hook(self._inputs, with_kwargs=True),
            model.register_forward_hook(self._outputs),
        ]

    def _inputs(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.recorder is not None and module.training:
            self.recorder.note_batch({**dict(enumerate(args)), **kwargs} if args else kwargs)

    def _outputs(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        loss = getattr(output, "loss", None) if not isinstance(output, dict) else output.get("loss")
        if self.recorder is not None and module.training and loss is not None:
            self.recorder.log(loss)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._counters is not None:
            self._counters.epochs += 1

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            recorder.close()
