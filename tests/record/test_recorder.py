from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from bisect_repro import Recorder, RecordOptions, Run, Trainee, record
from bisect_repro.capture.sketch import sketch_flat
from bisect_repro.record.recipe import build
from bisect_repro.record.session import RecordingSession


def record_example(examples, name, out, steps=20, every=5, checkpoint_every=10, **config):
    trainee = build(f"{examples / name}:build", config)
    return Run.open(
        record(
            trainee,
            out,
            RecordOptions(steps=steps, every=every, checkpoint_every=checkpoint_every),
            config=config,
        )
    )


@pytest.mark.parametrize(
    "name, config", [("mlp.py", {"num_workers": 0}), ("cnn.py", {"num_workers": 2})]
)
def test_a_run_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    examples, tmp_path, name, config
) -> None:
    # 32/16 batches an epoch: crosses epochs
    whole = record_example(examples, name, tmp_path / "whole", steps=45, **config)
    # a different start: the resume must overwrite it
    trainee = build(f"{examples / name}:build", {**config, "seed": 7})
    options = RecordOptions(steps=45, every=5, checkpoint_every=10)
    with Recorder(tmp_path / "resumed", trainee, options, resume_from=(whole.path, 20)) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    resumed = Run.open(tmp_path / "resumed")
    assert sorted(resumed.snapshots) == [20, 25, 30, 35, 40, 45]
    for step in resumed.snapshots:
        assert resumed.snapshot(step)["hashes"] == whole.snapshot(step)["hashes"], f"step {step}"
    for step in range(20, 45):
        assert resumed.steps[step]["order"] == whole.steps[step]["order"]
        assert resumed.steps[step]["batch"] == whole.steps[step]["batch"]
        assert resumed.steps[step]["loss"] == whole.steps[step]["loss"]


def test_without_the_streams_a_resume_diverges(examples, tmp_path) -> None:
    whole = record_example(examples, "mlp.py", tmp_path / "whole", steps=20)
    trainee = build(f"{examples / 'mlp.py'}:build", {"seed": 7})
    with Recorder(
        tmp_path / "bad",
        trainee,
        RecordOptions(steps=20, every=5),
        resume_from=(whole.path, 10),
        restore_streams=False,
    ) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    bad = Run.open(tmp_path / "bad")
    assert bad.snapshot(10)["hashes"] == whole.snapshot(10)["hashes"]
    assert bad.snapshot(15)["hashes"] != whole.snapshot(15)["hashes"]  # dropout drew other masks


def test_a_run_holds_what_the_issue_lists(examples, tmp_path) -> None:
    run = record_example(examples, "cnn.py", tmp_path / "r", steps=12, every=5, checkpoint_every=10)
    assert (
        sorted(run.snapshots) == [0, 5, 10, 12]
        and sorted(run.checkpoints) == [0, 10]
        and run.complete
    )
    assert sorted(run.steps) == list(range(12))
    assert all(
        r["order"] and r["batch"] and isinstance(r["loss"], float) for r in run.steps.values()
    )
    snapshot = run.snapshot(12)
    assert {"0.weight", "1.running_mean", "optimizer.0.weight.momentum_buffer"} <= set(
        snapshot["hashes"]
    )
    assert {"python", "numpy", "torch", "loader.generator"} <= set(snapshot["streams"])
    assert (
        snapshot["data"]["epoch"] == 0
        and snapshot["data"]["batch"] == 12
        and snapshot["data"]["base_seed"] is not None
    )
    environment = run.meta.environment
    for key in (
        "torch.get_num_threads",
        "torch.backends.cudnn.benchmark",
        "torch.get_float32_matmul_precision",
        "env.PYTHONHASHSEED",
        "cpu",
    ):
        assert key in environment
    assert run.meta.model["parameters"]["0.weight"] == [[16, 1, 3, 3], "float32"]
    # the parameters' sketches (taken in the hash's pass where the C kernel is built) are those of
    # the weights
    sketch, weights = run.snapshot(10)["sketch"], run.checkpoint(10)["model"]
    assert sketch["names"] == list(run.meta.model["parameters"]) and "0.weight" in sketch["names"]
    for name, row in zip(sketch["names"], sketch["values"], strict=True):
        assert torch.allclose(row, sketch_flat(weights[name]), rtol=1e-12, atol=1e-12), name


def test_own_loop_and_record_write_the_same_run(examples, tmp_path) -> None:
    driven = record_example(examples, "mlp.py", tmp_path / "a", steps=10)
    trainee = build(f"{examples / 'mlp.py'}:build", {})
    with Recorder(
        tmp_path / "b", trainee, RecordOptions(steps=10, every=5, checkpoint_every=10)
    ) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    own = Run.open(tmp_path / "b")
    assert sorted(own.snapshots) == sorted(driven.snapshots)
    assert own.snapshot(10)["hashes"] == driven.snapshot(10)["hashes"]


class Watched(torch.Tensor):
    """A loss that notes every torch function applied to it."""

    seen: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_steps_without_snapshot_leave_the_loss_unread(examples, tmp_path) -> None:
    trainee = build(f"{examples / 'mlp.py'}:build", {})
    with Recorder(tmp_path / "r", trainee, RecordOptions(steps=10, every=10)) as recorder:
        for step, batch in enumerate(recorder.batches()):
            Watched.seen.clear()
            recorder.log(trainee.step(batch).as_subclass(Watched))  # type: ignore[misc]
            if step < 9:
                assert set(Watched.seen) <= {"detach"}, Watched.seen
    run = Run.open(tmp_path / "r")
    assert len(run.steps) == 10 and all(isinstance(r["loss"], float) for r in run.steps.values())


def test_batch_hashes_equal_the_hash_of_each_batch_whether_deferred_or_not(
    examples, tmp_path, monkeypatch
) -> None:
    from bisect_repro.capture.hashing import hash_tensor
    from bisect_repro.capture.state import TrainingState
    from bisect_repro.record import session as recorder_module

    deferred = record_example(examples, "mlp.py", tmp_path / "deferred", steps=8, every=4)
    monkeypatch.setattr(recorder_module, "_DEFERRED_BATCH_BYTES", 0)  # hash every batch as it comes
    eager = record_example(examples, "mlp.py", tmp_path / "eager", steps=8, every=4)
    assert deferred.steps == eager.steps
    trainee = build(f"{examples / 'mlp.py'}:build", {})
    state = TrainingState(trainee)
    _, indices = state.data.next_batch()
    state.close()
    assert deferred.steps[0]["order"] == hash_tensor(torch.tensor(indices, dtype=torch.int64))


@pytest.mark.cuda
def test_steps_without_a_snapshot_never_synchronise_with_the_device(tmp_path, monkeypatch) -> None:
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    inputs, targets = torch.randn(512, 32, device=device), torch.randn(512, 1, device=device)
    loader = DataLoader(
        TensorDataset(inputs, targets),
        batch_size=32,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    trainee = Trainee.supervised(
        model, torch.optim.Adam(model.parameters(), lr=1e-3), loader, nn.functional.mse_loss
    )
    snapshot = RecordingSession._snapshot

    # fetching hashes and losses at a snapshot is the one allowed transfer
    def snapshot_may_synchronise(self, step):
        torch.cuda.set_sync_debug_mode(0)
        try:
            return snapshot(self, step)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(RecordingSession, "_snapshot", snapshot_may_synchronise)
    recorder = Recorder(tmp_path / "r", trainee, RecordOptions(steps=40, every=10))
    # any synchronising call on a step without a snapshot raises
    torch.cuda.set_sync_debug_mode("error")
    try:
        with recorder:
            for batch in recorder.batches():
                recorder.log(trainee.step(batch))  # type: ignore[misc]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    run = Run.open(tmp_path / "r")
    assert (
        run.complete
        and len(run.steps) == 40
        and all(isinstance(r["loss"], float) for r in run.steps.values())
    )


def test_without_a_step_count_a_finite_source_is_one_pass_and_an_endless_one_is_refused(
    tmp_path,
) -> None:
    from torch import nn

    from bisect_repro.errors import BisectReproError

    model = nn.Linear(2, 1)
    batches = [torch.randn(4, 2) for _ in range(5)]
    with Recorder(
        tmp_path / "a", Trainee(model, None, batches), RecordOptions(every=2)
    ) as recorder:
        seen = sum(1 for _ in recorder.batches())
    assert (
        seen == 5
        and Run.open(tmp_path / "a").complete
        and sorted(Run.open(tmp_path / "a").snapshots) == [0, 2, 4, 5]
    )

    def endless():
        while True:
            yield torch.randn(4, 2)

    refused = pytest.raises(
        BisectReproError,
        match=r"has no length, so the run may never end; give RecordOptions\(steps=N\)",
    )
    with (
        refused,
        Recorder(
            tmp_path / "b", Trainee(model, None, endless()), RecordOptions(every=2)
        ) as recorder,
    ):
        for _ in recorder.batches():
            pass


def test_accumulation_yields_the_micro_batches_of_a_step_and_hashes_them_all(tmp_path) -> None:
    from torch import nn

    from bisect_repro.capture.batch import combine_digests
    from bisect_repro.capture.hashing import hash_tensor
    from bisect_repro.errors import BisectReproError

    parts = [torch.full((2, 2), float(i)) for i in range(6)]
    with Recorder(
        tmp_path / "r", Trainee(nn.Linear(2, 1), None, parts), RecordOptions(every=1, accumulate=3)
    ) as recorder:
        steps = [batch for batch in recorder.batches()]
    assert [len(batch) for batch in steps] == [3, 3] and torch.equal(steps[1][0], parts[3])
    run = Run.open(tmp_path / "r")
    assert run.meta.options.accumulate == 3 and sorted(run.steps) == [0, 1]
    assert run.steps[1]["batch"] == combine_digests([hash_tensor(p) for p in parts[3:]])
    with pytest.raises(BisectReproError, match="accumulate 0: must be at least 1"):
        RecordOptions(accumulate=0)


def test_a_loop_calling_batches_once_per_epoch_records_on_until_the_planned_steps(tmp_path) -> None:
    from torch import nn

    batches = [torch.randn(4, 2) for _ in range(3)]
    recorder = Recorder(
        tmp_path / "r", Trainee(nn.Linear(2, 1), None, batches), RecordOptions(steps=6, every=2)
    )
    epochs = [
        sum(1 for _ in recorder.batches(steps=(epoch + 1) * len(batches))) for epoch in range(2)
    ]
    # closed by the second call, at the planned steps, with no close()
    run = Run.open(tmp_path / "r")
    assert (
        epochs == [3, 3]
        and run.complete
        and sorted(run.steps) == list(range(6))
        and sorted(run.snapshots) == [0, 2, 4, 6]
    )
    recorder.close()  # a second close changes nothing


def test_a_loop_that_stops_pulling_batches_ends_the_step_it_ran_when_it_closes(tmp_path) -> None:
    from torch import nn

    batches = [torch.randn(4, 2) for _ in range(8)]
    recorder = Recorder(
        tmp_path / "r", Trainee(nn.Linear(2, 1), None, batches), RecordOptions(steps=4, every=2)
    )
    pulled = recorder.batches()
    # a loop bounded by its own counter: after the 4th batch it never asks for a 5th
    for _ in range(4):
        next(pulled)
    recorder.close()
    run = Run.open(tmp_path / "r")
    assert run.complete and sorted(run.steps) == [0, 1, 2, 3] and sorted(run.snapshots) == [0, 2, 4]
    with (
        pytest.raises(ValueError),
        Recorder(
            tmp_path / "s", Trainee(nn.Linear(2, 1), None, batches), RecordOptions(steps=4)
        ) as failing,
    ):
        for _ in failing.batches():
            raise ValueError("the step failed")  # the step it was handed is not done
    failed = Run.open(tmp_path / "s")
    assert not failed.complete and sorted(failed.steps) == []


def test_each_snapshot_holds_the_activations_of_the_step_before_and_no_hook_outlives_the_run(
    tmp_path,
) -> None:
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    batches = [(torch.randn(5, 3), torch.randn(5, 1)) for _ in range(4)]
    trainee = Trainee.supervised(
        model, torch.optim.SGD(model.parameters(), lr=0.1), batches, nn.functional.mse_loss
    )
    inputs = []
    with Recorder(tmp_path / "r", trainee, RecordOptions(steps=4, every=1)) as recorder:
        for batch in recorder.batches():
            # the first layer's output at this step (the values its forward gives)
            inputs.append(model[0](batch[0]).detach())
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    assert all(not module._forward_hooks for module in model)
    run = Run.open(tmp_path / "r")
    for step in range(1, 5):
        taken = run.snapshot(step)["activations"]
        assert taken["step"] == step - 1 and taken["names"] == ["0", "1", "2"]
        assert torch.allclose(
            taken["values"][0], sketch_flat(inputs[step - 1]), rtol=1e-12, atol=1e-12
        ), step
