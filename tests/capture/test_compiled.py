"""The torch.compile watch: each call noted, and what it compiled compiled again in place (with
the ``eager`` backend, which compiles nothing but Dynamo's graph, so the tests stay cheap)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from bisect_repro import Trainee
from bisect_repro.capture import compiled


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # the watch's wrapper and setting are undone after the test
    monkeypatch.setattr(torch, "compile", torch.compile)
    monkeypatch.setattr(compiled, "_original", None)
    monkeypatch.setattr(compiled, "_noted", [])
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=True):
        compiled.watch_compile()
        yield
    torch._dynamo.reset()


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def test_a_compiled_module_is_noted_and_compiles_again_in_place(watched: None) -> None:
    model = nn.Linear(4, 2)
    held = torch.compile(model, backend="eager", dynamic=False)
    x = torch.randn(3, 4)
    assert torch.equal(held(x), model(x))
    [call] = compiled.calls()
    assert (call.target, call.backend, call.settings, call.replayable) == (
        "Linear",
        "eager",
        '{"dynamic": false}',
        True,
    )
    before = _graphs()
    compiled.recompile()
    held(x)
    assert _graphs() == before + 1  # the object the code holds compiled afresh


def test_module_compile_is_noted_and_compiles_again(watched: None) -> None:
    model = nn.Linear(4, 2)
    model.compile(backend="eager")
    first = model._compiled_call_impl
    [call] = compiled.calls()
    assert call.target == "Linear" and call.replayable
    compiled.recompile()
    assert model._compiled_call_impl is not first


def test_a_function_or_a_callable_backend_cannot_be_compiled_again(watched: None) -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch.compile(step, backend="eager")
    torch.compile(nn.Linear(2, 2), backend=lambda gm, inputs: gm)
    function, module = compiled.calls()
    assert (
        not function.replayable
        and function.why_not == "a function compiled on its own"
        and function.target.endswith("step")
    )
    assert (
        not module.replayable
        and module.why_not == "its backend is a callable"
        and module.backend == "<lambda>"
    )
    assert compiled.CompileCall.from_json(function.to_json()) == function


def test_the_decorator_form_is_noted(watched: None) -> None:
    @torch.compile(backend="eager")
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert torch.equal(double(torch.ones(2)), torch.full((2,), 2.0))
    assert [c.backend for c in compiled.calls()] == ["eager"]


def test_hooks_added_after_a_compiled_call_fire(watched: None) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    held = torch.compile(model, backend="eager")
    x = torch.randn(2, 4)
    held(x)  # compiled without hooks, as a replay's untraced steps run it
    seen: list[torch.Tensor] = []
    handle = model[0].register_forward_hook(
        lambda module, args, output: seen.append(output.detach().clone())
    )
    held(x)
    handle.remove()
    assert len(seen) == 1 and torch.equal(seen[0], model[0](x))


def test_another_backend_is_tried_without_inductors_mode_and_options(
    watched: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Linear(2, 2)
    model.compile(mode="max-autotune", dynamic=False)
    given: list[dict] = []
    monkeypatch.setattr(compiled, "_original", lambda target, **kwargs: given.append(kwargs))
    compiled.recompile(inductor=False)
    compiled.recompile()
    assert given == [{"dynamic": False}, {"mode": "max-autotune", "dynamic": False}]


def test_a_trainee_holds_the_module_torch_compile_wrapped() -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainee = Trainee(torch.compile(model, backend="eager"), optimizer, [])
    assert trainee.model is model and [n for n, _ in trainee.model.named_parameters()] == [
        "weight",
        "bias",
    ]
