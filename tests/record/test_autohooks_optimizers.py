"""The hooks of ``record -- python train.py`` with several optimizers, in this process: a step is
one iteration (it ends once each optimizer has stepped), the model is the parts they train, named
by the script's variables, and the loss is what ``backward()`` was called on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bisect_repro import RecordOptions, Run
from bisect_repro.record.autohooks import AutoHooks
from bisect_repro.record.parts import Parts, model_of


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def _gan_loop(out: Path, *, critic_steps: int, iterations: int = 3) -> tuple[Run, list[float]]:
    """A WGAN-style loop: the critic stepped ``critic_steps`` times per generator step."""
    hooks = AutoHooks(out, RecordOptions(every=1)).install()
    losses = []
    try:
        torch.manual_seed(0)
        netG, netC = nn.Linear(2, 3), Critic()
        opt_c = torch.optim.SGD(netC.parameters(), lr=0.01)
        opt_g = torch.optim.SGD(netG.parameters(), lr=0.01)
        for _ in range(iterations):
            total = 0.0
            for _ in range(critic_steps):
                opt_c.zero_grad()
                loss_c = (
                    netC(netG(torch.randn(4, 2)).detach()).mean() - netC(torch.randn(4, 3)).mean()
                )
                loss_c.backward()
                opt_c.step()
                total += loss_c.item()
            opt_g.zero_grad()
            loss_g = -netC(netG(torch.randn(4, 2))).mean()
            loss_g.backward()
            opt_g.step()
            losses.append(total + loss_g.item())
    finally:
        hooks.close()
    return Run.open(out), losses


@pytest.mark.parametrize("critic_steps", [1, 3])
def test_a_step_is_one_iteration_however_often_the_first_optimizer_steps_in_it(
    tmp_path: Path, critic_steps: int
) -> None:
    run, losses = _gan_loop(tmp_path / "r", critic_steps=critic_steps)
    assert sorted(run.steps) == [0, 1, 2]
    logged = run.losses()
    # the sum of what backward() was called on
    assert [logged[s] for s in range(3)] == pytest.approx(losses, rel=1e-5)
    names = set(run.snapshot(1)["hashes"])
    assert {"netC.main.weight", "netC.main.bias", "netG.weight", "netG.bias"} <= names
    # named by the variable, not the class
    assert not any(name.startswith("Critic") for name in names)


def test_the_parts_are_named_by_the_variables_and_one_module_holding_all_is_the_model() -> None:
    netG, netD = nn.Linear(2, 3), Critic()
    opt_d, opt_g = (
        torch.optim.SGD(netD.parameters(), lr=0.1),
        torch.optim.SGD(netG.parameters(), lr=0.1),
    )
    model = model_of([opt_d, opt_g], netD, sys._getframe())
    assert isinstance(model, Parts) and list(dict(model.named_children())) == ["netD", "netG"]
    del model
    both = nn.ModuleDict({"d": netD, "g": netG})
    # a module holding every optimizer's parameters
    assert model_of([opt_d, opt_g], netD, sys._getframe()) is both
    del both

    class Trainer:  # a method's self: its attributes are variables too
        def __init__(self) -> None:
            self.generator, self.critic = netG, netD

        def first_forward(self) -> torch.nn.Module:
            return model_of([opt_d, opt_g], netD, sys._getframe())

    # the innermost frame first: its own variables (netD, a closure variable), then its self's
    # attributes
    assert list(dict(Trainer().first_forward().named_children())) == ["netD", "generator"]
    # no frame: only __main__'s globals, which hold neither
    unnamed = model_of([opt_d, opt_g], netD, None)
    assert [name for name, _ in unnamed.named_parameters()] == [
        "optimizer1.group0_param0",
        "optimizer1.group0_param1",
        "Critic.main.weight",
        "Critic.main.bias",
    ]
