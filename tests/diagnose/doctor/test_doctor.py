"""The parts of ``doctor``: stream discovery, module attribution of ops (forward and backward),
determinism alerts, environment findings, the probes' comparison, and the human report."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from bisect_repro.capture.hidden import find_streams, stream_kind
from bisect_repro.capture.scope import DeterminismAlerts, ScopedOps
from bisect_repro.diagnose import advice
from bisect_repro.diagnose.doctor.audit import environment_findings
from bisect_repro.diagnose.doctor.checks import RecipeChecks
from bisect_repro.diagnose.doctor.doctor import SCHEMA, DoctorReport, doctor
from bisect_repro.diagnose.doctor.findings import Finding
from bisect_repro.diagnose.doctor.probe import (
    Probe,
    ProbedBatch,
    ProbeDifferences,
    differences,
    probe,
)
from bisect_repro.replay.launch import spec_for_recipe
from bisect_repro.replay.replica import Replica
from bisect_repro.report.text import render_doctor
from bisect_repro.serve.protocol import Description, HiddenStream


class Flip:
    def __init__(self) -> None:
        self.rng = random.Random()


class Augmented(Dataset[int]):
    def __init__(self) -> None:
        self.rng = np.random.default_rng()
        self.transforms = [Flip(), {"noise": torch.Generator()}]
        self.samples = list(range(64))
        self.table = torch.zeros(3)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> int:
        return self.samples[index]


def test_streams_hidden_in_datasets_are_found_by_attribute_path() -> None:
    dataset = Augmented()
    generator = torch.Generator()
    loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=generator)
    found = find_streams(loader, known=[generator])
    assert set(found) == {
        "loader.dataset.rng",
        "loader.dataset.transforms[0].rng",
        "loader.dataset.transforms[1]['noise']",
    }
    assert found["loader.dataset.rng"] is dataset.rng
    wrapped = find_streams(DataLoader(Subset(dataset, [0, 1]), batch_size=1))
    assert "loader.dataset.dataset.rng" in wrapped
    assert find_streams(DataLoader(TensorDataset(torch.zeros(4)), batch_size=2)) == {}


def test_stream_kinds_read_as_users_write_them() -> None:
    assert stream_kind(np.random.default_rng()) == "numpy.random.Generator"
    assert stream_kind(np.random.RandomState(0)) == "numpy.random.RandomState"
    assert stream_kind(random.Random()) == "random.Random"
    assert stream_kind(torch.Generator()) == "torch.Generator"


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(50, 4))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.table[tokens]


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = Lookup()
        self.head = nn.Linear(4, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1))


def test_ops_are_attributed_to_their_module_forward_and_backward() -> None:
    model = Bag()
    tracer = ScopedOps(model)
    with tracer.tracing():
        model(torch.randint(0, 50, (8, 6))).sum().backward()
    records = [(r, r.phase) for r in tracer.result()]
    assert ("aten.index.Tensor", "embed", "forward") in {(r.op, r.layer, p) for r, p in records}
    backward = {(r.op, r.layer) for r, p in records if p == "backward"}
    assert any("index_put" in op and layer == "embed" for op, layer in backward), backward
    assert any(layer == "head" for _, layer in backward)
    # the root module's own ops
    assert ("aten.mean.dim", None, "forward") in {(r.op, r.layer, p) for r, p in records}


class PutBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x * 1.0

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        flat = torch.zeros_like(grad).reshape(-1)
        flat.put_(torch.arange(flat.numel()), grad.reshape(-1))  # put_ has no deterministic kernel
        return flat.view_as(grad)


class Scatter(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = torch.zeros_like(x).reshape(-1)
        flat.put_(torch.arange(flat.numel()), x.reshape(-1))
        return flat.view_as(x)


class Odd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return PutBack.apply(x)


def test_ops_without_a_deterministic_kernel_are_caught_with_their_module() -> None:
    model = nn.Sequential(nn.Linear(3, 4), Scatter(), Odd(), nn.Linear(4, 1))
    alerts = DeterminismAlerts(model)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with alerts.catching():
            loss = model(torch.randn(5, 3)).sum()
            loss.backward()
    finally:
        torch.use_deterministic_algorithms(before)
    found = {(a["op"], a["layer"], a["phase"]) for a in alerts.alerts}
    assert found == {("aten.put_.default", "1", "forward"), ("aten.put_.default", "2", "backward")}
    assert all(
        "does not have a deterministic implementation" in a["message"] for a in alerts.alerts
    )
    assert model[0].weight.grad is not None  # the step ran to the end


def test_an_op_that_fails_for_another_reason_is_not_an_alert_and_its_error_stands() -> None:
    model = nn.Sequential(nn.Linear(3, 4))
    alerts = DeterminismAlerts(model)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with alerts.catching(), pytest.raises(RuntimeError, match="cannot be multiplied"):
            model(torch.randn(5, 7))
        assert torch.are_deterministic_algorithms_enabled()  # the switch is back as it was
    finally:
        torch.use_deterministic_algorithms(before)
    assert alerts.alerts == []


FINGERPRINT = {
    "torch.get_num_threads": 8,
    "cpu_count": 8,
    "torch.backends.cudnn.benchmark": False,
    "torch.backends.cuda.matmul.allow_tf32": False,
    "torch.backends.cudnn.allow_tf32": False,
    "torch.get_float32_matmul_precision": "highest",
    "torch.are_deterministic_algorithms_enabled": True,
    "torch.backends.cudnn.deterministic": True,
    "devices": [],
    "env.PYTHONHASHSEED": "0",
    "env.OMP_NUM_THREADS": "8",
}


def ids(findings: list[Finding]) -> dict[str, str]:
    return {f.id: f.severity for f in findings}


def test_settings_that_bite_elsewhere() -> None:
    assert environment_findings(FINGERPRINT, threads_pinned=True, audit=False) == []
    risky = {
        **FINGERPRINT,
        "torch.backends.cudnn.benchmark": True,
        "torch.get_float32_matmul_precision": "high",
    }
    found = environment_findings(risky, threads_pinned=False, audit=False)
    assert ids(found) == {
        "cudnn-benchmark": "warning",
        "tf32": "warning",
        "threads-unpinned": "warning",
    }
    assert all(f.evidence and f.fix for f in found)
    assert "no GPU here" in found[0].evidence
    default_conv = {**FINGERPRINT, "torch.backends.cudnn.allow_tf32": True}
    assert ids(environment_findings(default_conv, threads_pinned=True, audit=False)) == {
        "tf32": "info"
    }
    assert (
        environment_findings(default_conv, threads_pinned=True, audit=False, convolutions=False)
        == []
    )


def test_the_process_audit_explains_each_setting() -> None:
    gpu = {
        **FINGERPRINT,
        "devices": ["NVIDIA H100"],
        "torch.are_deterministic_algorithms_enabled": False,
    }
    gpu.update(
        {
            "torch.backends.cudnn.deterministic": False,
            "env.CUBLAS_WORKSPACE_CONFIG": None,
            "env.PYTHONHASHSEED": None,
        }
    )
    found = ids(environment_findings(gpu, threads_pinned=True, audit=True))
    assert found == {
        "deterministic-algorithms": "info",
        "cudnn-deterministic": "info",
        "cublas-workspace": "info",
        "pythonhashseed": "info",
        "environment-variables": "info",
        "versions": "info",
    }


def test_doctor_without_a_target_audits_this_process() -> None:
    result = doctor().to_json()
    assert result["schema"] == SCHEMA and result["reproducible"] and result["target"] is None
    assert all(f["severity"] != "error" for f in result["findings"])
    assert result["environment"]["torch"] == torch.__version__


def probe_result(*, init=None, hidden=None, batches=None) -> Probe:
    built = Description(
        init=init or {"0.weight": "a", "0.bias": "b"},
        streams={"torch": "t", "loader.generator": "g"},
        hidden={
            "loader.dataset.rng": HiddenStream(kind="numpy.random.Generator", digest=hidden or "r")
        },
        environment={},
        threads_set=[],
        loader={},
        convolutions=False,
        build_seeding=[],
    )
    rows = batches or [([1, 2], "c1", "l1"), ([3, 4], "c2", "l2")]
    probed = [
        ProbedBatch(indices=indices, content=content, base_seed=5, loss=loss)
        for indices, content, loss in rows
    ]
    return Probe(built=built, batches=probed, final={"0.weight": "x", "0.bias": "y"})


def test_probes_differences() -> None:
    a = probe_result()
    same = differences(a, probe_result())
    assert same.none and same == ProbeDifferences(
        init=[],
        streams=[],
        hidden=[],
        order=None,
        content=None,
        base_seed=None,
        loss=None,
        final=[],
    )
    b = probe_result(
        init={"0.weight": "a", "0.bias": "B"},
        hidden="R",
        batches=[([1, 2], "c1", "l1"), ([3, 4], "C2", "L2")],
    )
    diff = differences(a, b)
    assert diff.init == ["0.bias"] and diff.hidden == ["loader.dataset.rng"] and not diff.none
    assert diff.order is None and diff.content == 1 and diff.loss == 1
    shuffled = probe_result(batches=[([2, 1], "c9", "l1")])
    assert differences(a, shuffled).order == 0 and differences(a, shuffled).content is None


def test_a_recipe_replica_runs_with_the_recipe_settings_in_its_own_process() -> None:
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    config = {"threads": 1, "deterministic": True, "vocab": 50, "batch_size": 4}
    with Replica(spec_for_recipe("bisect_repro.demo:build", config), "demo") as replica:
        replica.connect()
        described = replica.describe()
        assert described.environment["torch.get_num_threads"] == 1
        assert described.environment["torch.are_deterministic_algorithms_enabled"] is True
        assert described.threads_set == [1]  # the recipe pins its thread count, and doctor sees it
        replica.fetch()
        assert replica.run(0, trace="none").entries == []
        assert replica.run(0, trace="full").entries
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (
        threads,
        deterministic,
    )


def test_fixes_for_hidden_generators_and_alerts() -> None:
    fix = advice.generator_fix("loader.dataset.rng", "numpy.random.Generator", workers=2)
    assert "np.random.default_rng(seed)" in fix and "worker_init_fn" in fix
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in advice.alert_fix(
        "aten.mm.default", "... set CUBLAS_WORKSPACE_CONFIG=:4096:8 ..."
    )
    assert "aten.put_.default" in advice.alert_fix(
        "aten.put_.default", "put_ does not have a deterministic implementation"
    )


@pytest.mark.parametrize("reproducible", [True, False])
def test_the_human_report_leads_with_the_verdict(reproducible: bool) -> None:
    finding = Finding("unseeded-init", "error", "0.weight differs", "seed it", layer="0")
    findings = [] if reproducible else [finding]
    report = DoctorReport(
        findings=findings, target="r.py:build", config={}, steps=3, seconds=1.0, environment={}
    )
    assert report.reproducible is reproducible
    out = io.StringIO()
    render_doctor(report, Console(file=out, width=120))
    text = out.getvalue()
    if reproducible:
        assert "Reproducible on this machine" in text
    else:
        assert (
            text.index("Not reproducible on this machine")
            < text.index("unseeded-init")
            < text.index("0.weight")
            < text.index("Fix:")
        )


DETERMINISM_RECIPE = """
import torch
from torch import nn
from bisect_repro import Trainee


class Scatter(nn.Module):
    def forward(self, x):
        flat = torch.zeros_like(x).reshape(-1)
        flat.put_(torch.arange(flat.numel()), x.reshape(-1))
        return flat.view_as(x)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), Scatter(), nn.Linear(4, 4), Scatter(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(5, 3), torch.randn(5, 1)) for _ in range(2)]
    return Trainee.supervised(model, optimizer, batches, nn.functional.mse_loss)
"""


def test_one_finding_per_op_without_a_deterministic_kernel(tmp_path) -> None:
    (tmp_path / "puts.py").write_text(DETERMINISM_RECIPE)
    with Replica(spec_for_recipe(f"{tmp_path / 'puts.py'}:build"), "puts") as replica:
        replica.connect()
        _, outcomes = probe(replica, 1, keep=True)
        local = RecipeChecks(replica, outcomes, {})
        local.determinism_alerts()
        local.rerun_steps()
    [finding] = local.findings
    assert finding.id == "deterministic-warning" and finding.severity == "warning"
    assert finding.op == "aten.put_.default" and finding.layer == "1"
    assert "forward pass of 1, the forward pass of 3" in finding.evidence
    # put_ without accumulate is deterministic on the CPU: PyTorch warns, the step repeats
    assert local.unrepeatable_step is None
