"""The recorder leaves the user's objects as it found them: while it records (its hooks in place at
every step), a model still pickles, deep-copies, saves whole with ``torch.save``, compiles and
wraps; a loader deep-copies and pickles to its own untapped self; an optimizer deep-copies. And a
copy made during recording (an EMA's) is not sampled as the model."""

from __future__ import annotations

import copy
import io
import pickle

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import Recorder, RecordOptions, Run, Trainee
from bisect_repro.capture.data import IndexTap


def trainee() -> Trainee:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return Trainee.supervised(model, optimizer, loader, nn.functional.mse_loss)


def test_a_recorded_model_loader_and_optimizer_copy_save_compile_and_wrap(tmp_path) -> None:
    t = trainee()
    model, optimizer, loader = t.model, t.optimizer, t.loader
    assert t.step is not None
    seen = []
    with Recorder(tmp_path / "run", t, RecordOptions(steps=4, every=1)) as recorder:
        for batch in recorder.batches():
            recorder.log(t.step(batch))
            restored = pickle.loads(pickle.dumps(model))
            twin = copy.deepcopy(model)
            buffer = io.BytesIO()
            torch.save(model, buffer)
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=False)
            x = torch.randn(2, 4)
            outputs = [m(x) for m in (model, restored, twin, loaded)]
            assert all(torch.equal(outputs[0], other) for other in outputs[1:])
            for copied in (restored, twin, loaded):  # no hook of the recorder came with them
                assert all(not m._forward_hooks for m in copied.modules())
            wrapped = nn.DataParallel(model)  # wraps on the CPU: calls the module itself
            assert torch.equal(wrapped(x), outputs[0])
            compiled = torch.compile(model, backend="eager")
            assert torch.allclose(compiled(x), outputs[0])
            copied_loader = copy.deepcopy(loader)
            assert not isinstance(copied_loader.batch_sampler, IndexTap)
            assert not isinstance(pickle.loads(pickle.dumps(loader)).batch_sampler, IndexTap)
            twin_optimizer = copy.deepcopy(optimizer)
            assert (
                twin_optimizer.state_dict()["param_groups"]
                == optimizer.state_dict()["param_groups"]
            )
            seen.append(recorder.step)
    assert seen == [0, 1, 2, 3]
    run = Run.open(tmp_path / "run")
    assert run.complete and sorted(run.snapshots) == [0, 1, 2, 3, 4]
