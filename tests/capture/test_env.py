from __future__ import annotations

import torch

from bisect_repro.capture import env


def test_fingerprint_has_every_switch_and_variable(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    found = env.fingerprint()
    for key in (
        *env.APPLICABLE,
        "python",
        "torch",
        "numpy",
        "cuda",
        "cudnn",
        "cpu",
        "devices",
        "env.PYTHONHASHSEED",
        "env.CUBLAS_WORKSPACE_CONFIG",
        "env.NCCL_ALGO",
    ):
        assert key in found
    assert found["env.NCCL_ALGO"] == "Ring"


def test_diff_names_what_changed_and_ignores_machine_names() -> None:
    a = {"torch.get_num_threads": 1, "hostname": "x", "python": "3.11"}
    b = {"torch.get_num_threads": 2, "hostname": "y", "python": "3.11"}
    assert env.diff(a, b) == {"torch.get_num_threads": [1, 2]}


def test_apply_sets_what_can_be_set_and_returns_the_previous() -> None:
    recorded = {
        **env.fingerprint(),
        "torch.get_num_threads": 1,
        "torch.are_deterministic_algorithms_enabled": True,
    }
    before = env.apply(recorded)
    try:
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    finally:
        env.apply(before)
    assert torch.get_num_threads() == before["torch.get_num_threads"]
    assert not torch.are_deterministic_algorithms_enabled()


def test_fingerprint_of_a_process_that_has_not_used_cuda_leaves_cuda_uninitialised(
    monkeypatch,
) -> None:
    """On a machine with a GPU, a CPU-only run's fingerprint asks nothing that initialises CUDA
    (cuDNN's version does: it reads every device's capability), so that no CUDA generator joins
    its streams; a fake GPU whose every query would initialise CUDA stands in for one."""

    def initialises(*_args, **_kwargs):
        raise AssertionError("the fingerprint initialised CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    for name in ("version",):
        monkeypatch.setattr(torch.backends.cudnn, name, initialises)
    for name in ("get_device_name", "get_device_capability", "get_device_properties", "init"):
        monkeypatch.setattr(torch.cuda, name, initialises)
    found = env.fingerprint()
    assert found["cudnn"] is None and found["devices"] == []
