"""The hooks of ``record -- python train.py``, in this process: which step each DataLoader batch and
forward input lands in, with its sample indices, each hashed once."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bisect_repro import RecordOptions, Run
from bisect_repro.capture.batch import combine_digests
from bisect_repro.capture.hashing import hash_tensor
from bisect_repro.record.autohooks import AutoHooks

DATA = TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8.0).reshape(8, 1))


def _recorded(tmp_path: Path, *, optimizer: bool, noise: bool = False) -> Run:
    hooks = AutoHooks(tmp_path / "r", RecordOptions(every=1)).install()
    try:
        torch.manual_seed(0)
        model = nn.Linear(2, 1)
        sgd = torch.optim.SGD(model.parameters(), lr=0.01) if optimizer else None
        for x, y in DataLoader(DATA, batch_size=2):  # in order: step s takes samples 2s and 2s + 1
            inputs = x + 1.0 if noise else x
            loss = nn.functional.mse_loss(model(inputs), y)
            loss.backward()
            if sgd is not None:
                sgd.step()
                sgd.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
    finally:
        hooks.close()
    return Run.open(tmp_path / "r")


def _expected(step: int, *forward: torch.Tensor) -> tuple[str, str]:
    x, y = DATA[2 * step : 2 * step + 2]
    order = hash_tensor(torch.tensor([2 * step, 2 * step + 1], dtype=torch.int64))
    return order, combine_digests([hash_tensor(x), hash_tensor(y), *map(hash_tensor, forward)])


def test_each_loader_batch_is_its_steps_and_the_same_tensors_at_the_forward_are_not_rehashed(
    tmp_path: Path,
) -> None:
    run = _recorded(tmp_path, optimizer=True)
    assert sorted(run.steps) == [0, 1, 2, 3]
    assert [(run.steps[s]["order"], run.steps[s]["batch"]) for s in range(4)] == [
        _expected(s) for s in range(4)
    ]


def test_without_an_optimizer_a_batch_drawn_after_a_backward_starts_the_next_step(
    tmp_path: Path,
) -> None:
    run = _recorded(tmp_path / "plain", optimizer=False)
    assert [(run.steps[s]["order"], run.steps[s]["batch"]) for s in sorted(run.steps)] == [
        _expected(s) for s in range(4)
    ]


def test_what_the_loop_does_to_a_batch_before_the_forward_is_hashed_too(tmp_path: Path) -> None:
    run = _recorded(tmp_path, optimizer=True, noise=True)
    x = DATA[0:2][0]
    assert (run.steps[0]["order"], run.steps[0]["batch"]) == _expected(0, x + 1.0)


def test_a_hooked_models_whole_pickle_and_copy_work_while_it_records(tmp_path: Path) -> None:
    """A script that saves its whole model (``torch.save(model)``) or deep-copies it mid-training:
    the hooks are none of the model's own, so nothing of the recorder is pickled with it."""
    hooks = AutoHooks(tmp_path / "r", RecordOptions(every=1)).install()
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
        sgd = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in DataLoader(DATA, batch_size=2):
            nn.functional.mse_loss(model(x), y).backward()
            sgd.step()
            sgd.zero_grad()
            torch.save(model, tmp_path / "model.pt")
            twin = copy.deepcopy(model)
            assert all(not m._forward_pre_hooks and not m._forward_hooks for m in twin.modules())
    finally:
        hooks.close()
    saved = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(saved[0].weight, model[0].weight)
    assert Run.open(tmp_path / "r").steps.keys() == {0, 1, 2, 3}


def test_an_image_optimized_through_a_frozen_network_is_the_models_state_not_a_batch(
    tmp_path: Path,
) -> None:
    hooks = AutoHooks(tmp_path / "r", RecordOptions(every=1)).install()
    try:
        torch.manual_seed(0)
        features = nn.Conv2d(3, 4, 3).requires_grad_(False)
        target = features(torch.rand(1, 3, 8, 8))  # a forward before the optimizer: no model
        image = torch.rand(1, 3, 8, 8).requires_grad_(True)
        adam = torch.optim.Adam([image], lr=0.1)
        for _ in range(3):
            adam.zero_grad()
            loss = nn.functional.mse_loss(features(image), target) * 10.0
            loss.backward()
            adam.step()
    finally:
        hooks.close()
    run = Run.open(tmp_path / "r")
    tensors = run.meta.model
    assert set(tensors["parameters"]) == {"features.weight", "features.bias"}
    assert set(tensors["buffers"]) == {"optimizer.image"}
    # each step is logged with its loss, its batch empty: the image is snapshotted, not hashed
    empty = combine_digests([])
    assert sorted(run.steps) == [0, 1, 2]
    assert all(run.steps[s]["batch"] == empty and run.steps[s]["loss"] > 0 for s in range(3))
    snapshots = [run.snapshot(s)["hashes"]["optimizer.image"] for s in (0, 1, 2)]
    assert len(set(snapshots)) == 3  # the image each step starts from


def test_a_network_run_before_any_optimizer_that_then_trains_an_image_is_named_in_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hooks = AutoHooks(tmp_path / "r", RecordOptions(every=1)).install()
    try:
        features = nn.Conv2d(3, 4, 3)
        features(torch.rand(1, 3, 8, 8))  # trainable, and no optimizer yet: taken as the model
        image = torch.rand(1, 3, 8, 8).requires_grad_(True)
        torch.optim.Adam([image], lr=0.1)
    finally:
        hooks.close()
    err = capsys.readouterr().err
    assert "the model was taken at the first forward with trainable parameters (Conv2d)" in err
    assert "(Adam) trains none of its parameters" in err and "requires_grad_(False)" in err
