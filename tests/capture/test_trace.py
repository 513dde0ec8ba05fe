from __future__ import annotations

import torch
from torch import nn

from bisect_repro.capture.state import parameter_names
from bisect_repro.capture.trace import (
    OpTracer,
    StepTracer,
    first_difference,
    first_divergent_op,
    uninitialised,
)


def make() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def traced_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> list:
    tracer = StepTracer(model, [("optimizer", optimizer)], parameter_names(model, optimizer))
    tracer.note_batch((batch,), [0, 1])
    with tracer:
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
    return tracer.result()


def test_entries_follow_execution_order_through_every_phase() -> None:
    model, optimizer = make()
    entries = traced_step(model, optimizer, torch.ones(2, 3))
    phases = [e.phase for e in entries]
    assert phases == sorted(phases, key=["data", "forward", "backward", "optimizer"].index)
    names = [e.tensor for e in entries]
    assert names[:2] == ["batch.indices", "batch[0]"]
    assert names.index("0.output") < names.index("2.input[0]") < names.index("2.output")
    # backward runs from the last layer to the first
    assert (
        names.index("2.grad_output") < names.index("2.weight.grad") < names.index("0.weight.grad")
    )
    assert {"0.weight", "optimizer.0.weight.exp_avg", "optimizer.2.bias.exp_avg_sq"} <= set(names)
    assert next(e for e in entries if e.tensor == "0.weight.grad").layer == "0"
    assert all(len(e.digest) == 16 for e in entries)


def test_hooks_are_removed_and_do_not_change_the_results() -> None:
    model, optimizer = make()
    traced_step(model, optimizer, torch.ones(2, 3))
    traced = [p.detach().clone() for p in model.parameters()]
    plain_model, plain_optimizer = make()
    plain_optimizer.zero_grad()
    plain_model(torch.ones(2, 3)).sum().backward()
    plain_optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(traced, plain_model.parameters(), strict=True))
    assert not model[0]._forward_hooks


def test_first_difference_names_the_first_tensor_that_differs() -> None:
    model_a, optimizer_a = make()
    model_b, optimizer_b = make()
    with torch.no_grad():
        model_b[2].bias += 1e-3  # the last layer differs from the start
    a = traced_step(model_a, optimizer_a, torch.ones(2, 3))
    b = traced_step(model_b, optimizer_b, torch.ones(2, 3))
    index = first_difference(a, b)
    assert index is not None and a[index].tensor == "2.output" and a[index].phase == "forward"
    assert first_difference(a, a) is None


def test_op_tracer_counts_python_arguments_as_inputs() -> None:
    model = nn.Linear(3, 3)

    def run(scale: float) -> list:
        with OpTracer(model).tracing() as tracer:
            y = model(torch.ones(1, 3))
            (y * scale).sum()
        return tracer.result()

    a, b = run(2.0), run(2.0 + 1e-3)
    found = first_divergent_op(a, b)
    assert found is not None
    index, inputs_match = found
    record = a[index]
    assert record.op == "aten.mul.Tensor" and record.layer is None
    assert (
        not inputs_match
        and record.inputs == b[index].inputs
        and record.arguments != b[index].arguments
    )
    assert first_divergent_op(a, run(2.0)) is None


def test_ops_returning_uninitialised_memory_are_never_compared() -> None:
    def run() -> list:
        with OpTracer().tracing() as tracer:
            torch.empty(1000).fill_(1.0)
            torch.empty_like(torch.ones(10))
        return tracer.result()

    a = run()
    assert [r.op for r in a if not r.outputs] == [
        "aten.empty.memory_format",
        "aten.empty_like.default",
    ]
    assert (
        uninitialised("aten.empty_like.default")
        and uninitialised("aten.resize_.default")
        and not uninitialised("aten.add.Tensor")
    )
    assert first_divergent_op(a, run()) is None


def _hand_updated_step(
    model: nn.Module,
    batch: torch.Tensor,
    *,
    evaluate: bool,
    frozen_first: bool = False,
    evaluated_first: bool = False,
) -> list:
    """A loop with no optimizer: forward, backward, the update by hand, then (``evaluate``) a
    forward under ``torch.no_grad()`` on another batch, before the next step begins."""
    tracer = StepTracer(model, [], {id(p): name for name, p in model.named_parameters()})
    tracer.note_batch((batch,), None)
    with tracer:
        if frozen_first:
            with torch.no_grad():
                model(batch * 2)  # a frozen pass before the backward is part of the step
        if evaluated_first:  # a periodic evaluation at the top of the loop
            model.eval()
            with torch.no_grad():
                model(torch.full((5, 3), 7.0))
            model.train()
        model(batch).sum().backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(-0.1 * parameter.grad)
            if evaluate:
                model(torch.full((5, 3), 7.0))
    return tracer.result()


def test_an_evaluation_under_no_grad_after_the_backward_is_no_part_of_the_step() -> None:
    plain = _hand_updated_step(make()[0], torch.ones(2, 3), evaluate=False)
    evaluated = _hand_updated_step(make()[0], torch.ones(2, 3), evaluate=True)
    assert first_difference(plain, evaluated) is None  # the same update: the step is the same
    frozen = _hand_updated_step(make()[0], torch.ones(2, 3), evaluate=False, frozen_first=True)
    # no_grad before the backward: traced
    assert len(frozen) > len(plain) and [e.phase for e in frozen[1:4]] == ["forward"] * 3
    # in eval mode, before the step's forward: an evaluation, no part of the step
    early = _hand_updated_step(make()[0], torch.ones(2, 3), evaluate=False, evaluated_first=True)
    assert first_difference(plain, early) is None and len(early) == len(plain)
