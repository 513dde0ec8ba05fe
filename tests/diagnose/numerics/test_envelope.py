"""Which experiment measures the envelope: run B's TF32 settings, where they differ from run A's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bisect_repro.diagnose.numerics.envelope import experiments, tf32_of


def run(**environment: Any) -> Any:
    return SimpleNamespace(environment=environment)


def test_the_same_tf32_settings_give_no_tf32_experiment() -> None:
    a = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": False,
            "env.NVIDIA_TF32_OVERRIDE": None,
            "torch.get_num_threads": 1,
        }
    )
    b = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": False,
            "env.NVIDIA_TF32_OVERRIDE": None,
            "torch.get_num_threads": 2,
        }
    )
    assert tf32_of(a, b) is None


def test_run_bs_switches_and_variables_where_they_differ() -> None:
    a = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": False,
            "torch.backends.cudnn.allow_tf32": True,
            "env.NVIDIA_TF32_OVERRIDE": "0",
        }
    )
    b = run(
        **{
            "torch.backends.cuda.matmul.allow_tf32": True,
            "torch.backends.cudnn.allow_tf32": True,
            "torch.get_float32_matmul_precision": "high",
            "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
        }
    )
    switches, variables = tf32_of(a, b) or ({}, {})
    assert switches == {
        "torch.backends.cuda.matmul.allow_tf32": True,
        "torch.get_float32_matmul_precision": "high",
    }
    # None: unset in the replay
    assert variables == {"NVIDIA_TF32_OVERRIDE": None, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}


@pytest.mark.parametrize("value", ["os.system('x')", 1, ["high"], "HIGH"])
def test_a_switch_value_no_switch_takes_is_left_out(value: Any) -> None:
    a = run(**{"torch.get_float32_matmul_precision": "highest"})
    b = run(
        **{"torch.get_float32_matmul_precision": value, "torch.backends.cudnn.allow_tf32": "yes"}
    )
    assert tf32_of(a, b) is None


def test_the_experiments_in_order_the_last_one_marked() -> None:
    tried = experiments(4, None, None)
    assert [(method, last) for method, _, last in tried] == [
        ("1 torch threads instead of 4", False),
        ("every weight moved one ulp", True),
    ]
    assert [(c.threads, c.perturb, c.tf32) for _, c, _ in tried] == [
        (1, False, None),
        (4, True, None),
    ]


def test_differing_tf32_settings_are_tried_first_on_the_recorded_thread_count() -> None:
    tf32 = ({"torch.backends.cuda.matmul.allow_tf32": True}, {"NVIDIA_TF32_OVERRIDE": None})
    method, change, last = experiments(1, tf32, None)[0]
    assert (
        method == "run B's TF32 settings (torch.backends.cuda.matmul.allow_tf32=True, "
        "NVIDIA_TF32_OVERRIDE=(unset))"
    )
    assert (change.threads, change.tf32, last) == (1, tf32, False)
    assert experiments(1, tf32, None)[1][0] == "2 torch threads instead of 1"


def test_a_run_that_differs_from_itself_is_its_own_envelope_and_nothing_else() -> None:
    tf32 = ({"torch.backends.cuda.matmul.allow_tf32": True}, {})
    tried = experiments(16, tf32, "aten.index_add.default")
    assert [(m, c.threads, c.perturb, c.tf32, last) for m, c, last in tried] == [
        (
            "nothing changed (run A differs from itself: aten.index_add.default)",
            16,
            False,
            None,
            True,
        )
    ]
