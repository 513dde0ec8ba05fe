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
    recorded = {**env.fingerprint(), "torch.get_num_threads": 1, "torch.are_deterministic_algorithms_enabled": True}
    before = env.apply(recorded)
    try:
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    finally:
        env.apply(before)
    assert torch.get_num_threads() == before["torch.get_num_threads"]
    assert not torch.are_deterministic_algorithms_enabled()
