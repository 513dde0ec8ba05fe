"""A trainee with several optimizers: each one's state hashed, named, saved and restored, and its
settings recorded."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from bisect_repro.capture.state import TrainingState
from bisect_repro.errors import RecipeError
from bisect_repro.trainee import Trainee, optimizer_prefix


def _gan(lr_g: float = 0.01) -> Trainee:
    torch.manual_seed(0)
    model = nn.ModuleDict({"netD": nn.Linear(3, 1), "netG": nn.Linear(2, 3)})
    opt_d = torch.optim.Adam(model["netD"].parameters(), lr=0.01)
    opt_g = torch.optim.Adam(model["netG"].parameters(), lr=lr_g, betas=(0.5, 0.9))

    def step(batch: torch.Tensor) -> torch.Tensor:
        opt_d.zero_grad()
        loss_d = model["netD"](model["netG"](batch).detach()).mean()
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = -model["netD"](model["netG"](batch)).mean()
        loss_g.backward()
        opt_g.step()
        return loss_g

    return Trainee(model, [opt_d, opt_g], [torch.randn(4, 2) for _ in range(3)], step)


def test_each_optimizer_is_named_by_its_index_the_first_as_before() -> None:
    assert [optimizer_prefix(i) for i in range(3)] == ["optimizer", "optimizer1", "optimizer2"]
    trainee = _gan()
    assert trainee.optimizer is trainee.optimizers[0] and len(trainee.optimizers) == 2
    assert [prefix for prefix, _ in trainee.named_optimizers] == ["optimizer", "optimizer1"]


def test_every_optimizers_state_is_hashed_and_its_settings_recorded() -> None:
    trainee = _gan()
    trainee.step(next(iter(trainee.source)))  # type: ignore[misc]
    state = TrainingState(trainee)
    names = set(state.tensors())
    assert {
        "optimizer.netD.weight.exp_avg",
        "optimizer1.netG.weight.exp_avg",
        "optimizer1.netG.bias.exp_avg_sq",
    } <= names
    assert not any(
        name.startswith("optimizer.netG") or name.startswith("optimizer1.netD") for name in names
    )
    settings = state.settings()
    assert settings["optimizer.group0.lr"] == 0.01 and settings["optimizer1.group0.betas"] == [
        0.5,
        0.9,
    ]
    assert TrainingState(_gan(lr_g=0.02)).settings()["optimizer1.group0.lr"] == 0.02


def test_a_checkpoint_restores_the_second_optimizer_too() -> None:
    trainee = _gan()
    batch = next(iter(trainee.source))
    trainee.step(batch)  # type: ignore[misc]
    # state_dict() shares the live tensors
    saved = copy.deepcopy(TrainingState(trainee).state_dict())
    assert set(saved) >= {"optimizer", "optimizer1"}
    before = {k: v.clone() for k, v in TrainingState(trainee).tensors().items()}
    trainee.step(batch)  # type: ignore[misc]
    moved = TrainingState(trainee).tensors()
    assert not torch.equal(
        moved["optimizer1.netG.weight.exp_avg"], before["optimizer1.netG.weight.exp_avg"]
    )
    TrainingState(trainee).load_state_dict(saved)
    after = TrainingState(trainee).tensors()
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_optimizers_given_as_a_field_or_a_list_agree_and_bad_ones_are_refused() -> None:
    model = nn.Linear(2, 2)
    one, two = (
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.optim.SGD(model.parameters(), lr=0.2),
    )
    assert Trainee(model, None, [], optimizers=[one, two]).optimizers == (one, two)
    assert Trainee(model, one, [], optimizers=[one, two]).optimizers == (one, two)
    assert Trainee(model, one, []).optimizers == (one,)
    with pytest.raises(RecipeError, match="empty list"):
        Trainee(model, [], [])
    with pytest.raises(RecipeError, match=r"expected a torch\.optim\.Optimizer"):
        Trainee(model, [one, "adam"], [])  # type: ignore[list-item]
